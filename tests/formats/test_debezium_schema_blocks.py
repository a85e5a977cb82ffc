"""Schema blocks read once: a ``debezium-json`` decoder with ``schema-include`` parses a message's Connect
schema block only when its opening bytes are new, and then reads the payload alone.

On the project's PostgreSQL recording (three tables, two with a 2-5 kB block in every message, as
Kafka Connect's JsonConverter writes them): the changes equal those of the same messages re-spaced
(so no message opens with a known block and each is parsed whole), and only the first message of
each block is parsed whole.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import cdcflow.formats.debezium.json as debezium_json
from cdcflow.formats import Message, resolve_format
from cdcflow.formats.errors import DecodeError

RECORDING = Path(__file__).parent / "recorded" / "postgres" / "schemas.jsonl"
OPTIONS = {"schema-include": "true", "changelog-mode": "upsert"}


def messages(respace: bool = False) -> list[Message]:
    found = []
    for offset, line in enumerate(RECORDING.read_text().splitlines()):
        record = json.loads(line)
        value = record["value"]
        if value is not None and respace:
            value = '{"schema": ' + json.dumps(json.loads(value), indent=1)[len('{\n "schema": ') :]
        key = record["key"].encode() if record["key"] else None
        found.append(Message(value and value.encode(), key=key, topic=record["topic"], offset=offset))
    return found


def decoded(records: list[Message]) -> list[tuple[str, str, dict[str, Any]]]:
    by_topic: dict[str, Any] = {}
    out = []
    for message in records:
        decoder = by_topic.setdefault(message.topic, resolve_format("debezium-json").create_decoder(OPTIONS))
        for change in decoder.decode_all([message]).changes:
            out.append((message.topic, change.kind.value, change.row))
    return out


def test_known_blocks_are_not_parsed_again_and_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    whole: list[bytes] = []
    parse = debezium_json.parse_json

    def counting(data: bytes) -> Any:
        if data.startswith(b'{"schema":'):
            whole.append(data)
        return parse(data)

    monkeypatch.setattr(debezium_json, "parse_json", counting)
    fast = decoded(messages())
    parsed_whole = len(whole)
    whole.clear()
    slow = decoded(messages(respace=True))
    assert repr(fast) == repr(slow) and len(fast) > 20  # repr: NaN values compare unequal
    blocks = {
        json.dumps(json.loads(m.value)["schema"], sort_keys=True) for m in messages() if m.value is not None
    }
    assert parsed_whole == len(blocks) < len(whole), (parsed_whole, len(blocks), len(whole))


def test_one_decoder_over_alternating_blocks_gives_each_message_its_own_columns_and_schema() -> None:
    """Messages of three tables interleaved through one decoder (a file or a topic of a whole
    database): each block's converter and ``schema`` column text is its own, whichever came before."""
    metadata = ("schema", "source.sequence", "op")
    options = {**OPTIONS, "unavailable-values": "report"}  # no state carried from message to message

    def rows(records: list[Message], *, shared: bool) -> list[tuple[str, dict[str, Any]]]:
        decoder = resolve_format("debezium-json").create_decoder(options, metadata=metadata)
        out = []
        for message in records:
            if not shared:
                decoder = resolve_format("debezium-json").create_decoder(options, metadata=metadata)
            out += [(change.kind.value, change.row) for change in decoder.decode_all([message]).changes]
        return out

    fast = rows(round_robin(messages()), shared=True)
    alone = rows(round_robin(messages()), shared=False)  # a decoder of its own for each message
    assert repr(fast) == repr(alone) and len(fast) > 20
    names = [json.loads(row["schema"])["name"] for _, row in fast]
    assert len(set(names)) == 3 and sum(a != b for a, b in itertools.pairwise(names)) > 10, names


def round_robin(records: list[Message]) -> list[Message]:
    """One message of each table in turn (the tables' own orders kept)."""
    by_topic: dict[str | None, list[Message]] = {}
    for message in records:
        by_topic.setdefault(message.topic, []).append(message)
    turns = itertools.zip_longest(*by_topic.values())
    return [message for turn in turns for message in turn if message is not None]


def test_a_message_after_its_block_that_is_not_json_fails_as_before() -> None:
    good = next(m for m in messages() if m.value is not None and m.topic.endswith("cdc_small"))
    assert good.value is not None
    decoder = resolve_format("debezium-json").create_decoder(OPTIONS)
    decoder.decode_all([good])
    broken = Message(good.value[:-1] + b",}", topic=good.topic, offset=99)
    with pytest.raises(DecodeError, match="offset 99.*not valid JSON"):
        decoder.decode_all([broken])
