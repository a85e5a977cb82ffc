"""Recorded topics: the dump format byte for byte, plain files, byte-range splits, and recording a topic
from a Kafka cluster."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka_fixture import KafkaCluster, unique_topic

from cdcflow.connectors.errors import ConnectorOptionError, ReplayFormatError
from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.replay import dumps as replay
from cdcflow.formats import Message

TESTDATA = Path(__file__).parent.parent / "formats" / "testdata"
REPLAY_DOC = Path(__file__).resolve().parents[2] / "docs" / "replay.md"

MESSAGES = [
    Message(b'{"id": 1}', b"k1", "orders", 0, 7, 1_700_000_000_000, (("trace", b"abc"),)),
    Message(None, b"\x00\xff\xfe", "orders", 0, 8, 1_700_000_000_001, (("empty", None), ("trace", b""))),
    Message(b"\xc3\xa9t\xc3\xa9", None, "caf\u00e9", 2, 0, None, ()),
]
DUMP = (
    b'{"cdcflow-topic-dump":1}\n'
    b'{"topic":"orders","partition":0,"offset":7,"timestamp":1700000000000,"key":"azE=",'
    b'"value":"eyJpZCI6IDF9","headers":[["trace","YWJj"]]}\n'
    b'{"topic":"orders","partition":0,"offset":8,"timestamp":1700000000001,"key":"AP/+",'
    b'"value":null,"headers":[["empty",null],["trace",""]]}\n'
    b'{"topic":"caf\xc3\xa9","partition":2,"offset":0,"timestamp":null,"key":null,"value":"w6l0w6k=","headers":[]}\n'
)


def without_origin(messages: list[Message]) -> list[Message]:
    return [replace(m, file=None, line=None) for m in messages]


def test_dump_bytes_are_exact_and_read_back_to_the_same_messages(tmp_path: Path) -> None:
    path = tmp_path / "orders.dump.jsonl"
    assert replay.write_dump(path, MESSAGES) == 3
    assert path.read_bytes() == DUMP
    got = list(replay.read_messages(str(path)))
    assert without_origin(got) == MESSAGES
    assert [(m.file, m.line) for m in got] == [(str(path), 2), (str(path), 3), (str(path), 4)]
    again = tmp_path / "again.jsonl"
    replay.write_dump(again, got)
    assert again.read_bytes() == DUMP


def test_the_documented_example_dump_is_what_cdcflow_writes(tmp_path: Path) -> None:
    block = re.search(
        r"```\n(\{\"cdcflow-topic-dump\":1\}\n.*?)```", REPLAY_DOC.read_text(encoding="utf-8"), re.S
    )
    assert block is not None, "docs/replay.md lost its example dump"
    example = tmp_path / "example.jsonl"
    example.write_text(block.group(1), encoding="utf-8")
    rewritten = tmp_path / "rewritten.jsonl"
    assert replay.write_dump(rewritten, replay.read_messages(str(example))) == 2
    assert rewritten.read_bytes() == example.read_bytes()


def test_dump_is_plain_json_lines_readable_without_cdcflow(tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    replay.write_dump(path, MESSAGES)
    header, *records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert header == {"cdcflow-topic-dump": 1}
    assert [(r["topic"], r["partition"], r["offset"]) for r in records] == [
        ("orders", 0, 7),
        ("orders", 0, 8),
        ("caf\u00e9", 2, 0),
    ]


headers = st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3)
messages = st.builds(
    Message,
    value=st.none() | st.binary(max_size=40),
    key=st.none() | st.binary(max_size=10),
    topic=st.text(min_size=1, max_size=8),
    partition=st.integers(0, 1000),
    offset=st.integers(0, 2**63 - 1),
    timestamp_ms=st.none() | st.integers(0, 2**53),
    headers=headers.map(tuple),
)


@given(st.lists(messages, max_size=10))
@settings(max_examples=60, deadline=None)
def test_any_messages_survive_a_dump_round_trip(batch: list[Message]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dump.jsonl"
        replay.write_dump(path, batch)
        assert without_origin(list(replay.read_messages(str(path)))) == batch


lines = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@given(lines, st.booleans(), st.lists(st.integers(0, 200), max_size=6))
@settings(max_examples=150, deadline=None)
def test_splits_read_every_line_exactly_once(
    contents: list[bytes], final_newline: bool, cuts: list[int]
) -> None:
    text = b"\n".join(contents) + (b"\n" if final_newline and contents else b"")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "plain.txt"
        path.write_bytes(text)
        whole = list(replay.read_messages(str(path)))
        expected = [(n, c.rstrip(b"\r")) for n, c in enumerate(contents, start=1) if c.strip()]
        assert [(m.line, m.value) for m in whole] == expected
        points = sorted({0, len(text), *(c for c in cuts if c < len(text))})
        pieces = [
            m for s, e in zip(points, points[1:], strict=False) for m in replay.read_messages(str(path), s, e)
        ]
        assert pieces == whole


@given(st.lists(messages, min_size=1, max_size=8), st.lists(st.integers(0, 2000), max_size=5))
@settings(max_examples=60, deadline=None)
def test_dump_splits_read_every_record_exactly_once(batch: list[Message], cuts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dump.jsonl"
        replay.write_dump(path, batch)
        size = replay.file_size(str(path))
        points = sorted({0, size, *(c for c in cuts if c < size)})
        pieces = [
            m for s, e in zip(points, points[1:], strict=False) for m in replay.read_messages(str(path), s, e)
        ]
        assert without_origin(pieces) == batch
        assert [m.line for m in pieces] == list(range(2, len(batch) + 2))


def test_plain_recorded_files_give_one_message_per_non_blank_line() -> None:
    path = TESTDATA / "apache_paimon/kafka/ogg/table/event/event-insert.txt"
    raw = path.read_bytes().split(b"\n")
    got = list(replay.read_messages(str(path)))
    assert [(m.line, m.value) for m in got] == [
        (n, line) for n, line in enumerate(raw, start=1) if line.strip()
    ]
    assert all(m.file == str(path) and m.topic is None and m.key is None for m in got)
    assert not replay.is_dump(str(path))


def test_crlf_line_ends_are_not_part_of_the_value(tmp_path: Path) -> None:
    path = tmp_path / "crlf.txt"
    path.write_bytes(b'{"a": 1}\r\n\r\n{"a": 2}\r\n')
    assert [(m.line, m.value) for m in replay.read_messages(str(path))] == [
        (1, b'{"a": 1}'),
        (3, b'{"a": 2}'),
    ]


def test_list_files_takes_a_file_a_directory_or_a_glob(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.jsonl", ".hidden.jsonl", "_SUCCESS", "c.txt"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "sub").mkdir()
    assert replay.list_files(str(tmp_path)) == [str(tmp_path / n) for n in ("a.jsonl", "b.jsonl", "c.txt")]
    assert replay.list_files(str(tmp_path / "*.jsonl")) == [str(tmp_path / n) for n in ("a.jsonl", "b.jsonl")]
    assert replay.list_files(str(tmp_path / "c.txt")) == [str(tmp_path / "c.txt")]
    with pytest.raises(
        ConnectorOptionError, match="path '.*nope' does not exist: give a file, a directory or a glob"
    ):
        replay.list_files(str(tmp_path / "nope"))
    with pytest.raises(ConnectorOptionError, match="names no file to replay"):
        replay.list_files(str(tmp_path / "*.avro"))


HEADER = '{"cdcflow-topic-dump":1}\n'
GOOD = '{"topic":"t","partition":0,"offset":1,"timestamp":null,"key":null,"value":"eA==","headers":[]}'
MALFORMED = [
    (HEADER + '{"topic": "t",\n', ":2: not valid JSON"),
    (HEADER + "[1, 2]\n", ":2: expected a record object, got list"),
    (HEADER + GOOD + "\n" + '{"topic":"t","partition":0,"offset":2}\n', ":3: a record has the keys"),
    (HEADER + GOOD.replace('"headers"', '"hedaers"') + "\n", "missing: none, unknown: hedaers"),
    (HEADER + GOOD.replace('"eA=="', '"e!A"') + "\n", ":2: 'value' is not valid base64"),
    (HEADER + GOOD.replace('"eA=="', "12") + "\n", ":2: 'value' must be base64 text or null, got int"),
    (
        HEADER + GOOD.replace('"partition":0', '"partition":-1') + "\n",
        ":2: 'partition' must be an integer >= 0",
    ),
    (HEADER + GOOD.replace('"offset":1', '"offset":true') + "\n", ":2: 'offset' must be an integer >= 0"),
    (HEADER + GOOD.replace('"topic":"t"', '"topic":""') + "\n", ":2: 'topic' must be a topic name"),
    (
        HEADER + GOOD.replace('"timestamp":null', '"timestamp":"now"') + "\n",
        ":2: 'timestamp' must be milliseconds",
    ),
    (HEADER + GOOD.replace('"headers":[]', '"headers":[["h"]]') + "\n", ":2: 'headers' must be a list of"),
    (
        HEADER + GOOD.replace('"headers":[]', '"headers":[["h","!"]]') + "\n",
        ":2: 'header 'h'' is not valid base64",
    ),
    (HEADER + GOOD.replace('"headers":[]', '"headers":{"ab":"x"}') + "\n", ":2: 'headers' must be a list of"),
    (HEADER + GOOD.replace('"headers":[]', '"headers":null') + "\n", ":2: 'headers' must be a list of"),
    (
        HEADER + GOOD.replace('"headers":[]', '"headers":[[1,"eA=="]]') + "\n",
        ":2: 'headers' must be a list of",
    ),
    ('{"cdcflow-topic-dump":2}\n' + GOOD + "\n", ":1: topic dump version 2 is not supported"),
    (
        '{"cdcflow-topic-dump":1\n' + GOOD + "\n",
        ":1: looks like a cdcflow topic dump header but is not valid JSON",
    ),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_dumps_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReplayFormatError) as error:
        list(replay.read_messages(str(path)))
    assert str(error.value).startswith(str(path) + ":")
    assert message in str(error.value)


def test_a_failed_dump_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "partial.jsonl"
    with pytest.raises(ReplayFormatError, match="it needs its topic, partition and offset"):
        replay.write_dump(path, [MESSAGES[0], Message(b"no coordinates")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_record_topic_dumps_every_partition_in_order(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    first, second = unique_topic("rec-a"), unique_topic("rec-b")
    kafka_cluster.create_topic(first, 2)
    kafka_cluster.create_topic(second, 1)
    produced = [
        Message(
            f"v{i}".encode(),
            f"k{i}".encode(),
            partition=i % 2,
            timestamp_ms=1_700_000_000_000 + i,
            headers=(("n", None),),
        )
        for i in range(7)
    ]
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, produced, first)
    kafka_producer.produce_messages(
        kafka_cluster.bootstrap_servers, [Message(None, b"gone", partition=0)], second
    )
    path = tmp_path / "recorded.jsonl"
    options = {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "subscribe": f"{second},{first}"}
    summary = replay.record_topic(options, path)
    assert (summary.records, summary.partitions, summary.topics) == (8, 3, tuple(sorted((first, second))))
    assert (
        str(summary)
        == f"recorded 8 records from 3 partitions of {', '.join(sorted((first, second)))} to {path}"
    )
    got = without_origin(list(replay.read_messages(str(path))))
    expected = [
        replace(m, topic=first, offset=offset)
        for partition in (0, 1)
        for offset, m in enumerate(m for m in produced if m.partition == partition)
    ] + [Message(None, b"gone", second, 0, 0, got[-1].timestamp_ms)]
    assert got == sorted(expected, key=lambda m: (m.topic or "", m.partition or 0, m.offset or 0))
    again = tmp_path / "again.jsonl"
    replay.record_topic(options, again)
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.integration
def test_record_topic_honours_starting_and_ending_offsets(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic = unique_topic("rec-range")
    kafka_cluster.create_topic(topic, 1)
    kafka_producer.produce_messages(
        kafka_cluster.bootstrap_servers, [Message(b"%d" % i, partition=0) for i in range(6)], topic
    )
    path = tmp_path / "range.jsonl"
    summary = replay.record_topic(
        {
            "kafka.bootstrap.servers": kafka_cluster.bootstrap_servers,
            "assign": f'{{"{topic}": [0]}}',
            "startingOffsets": f'{{"{topic}": {{"0": 2}}}}',
            "endingOffsets": f'{{"{topic}": {{"0": 5}}}}',
        },
        path,
    )
    assert summary.records == 3
    assert [(m.offset, m.value) for m in replay.read_messages(str(path))] == [(2, b"2"), (3, b"3"), (4, b"4")]
