"""The Kafka client with Spark's Kafka-source semantics: options, offsets, ranges and reads against a
real cluster over TCP."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
from kafka_fixture import KafkaCluster, unique_topic

from cdcflow.cli import main
from cdcflow.connectors.errors import ConnectorOptionError, DataLossError, KafkaConnectorError
from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import offsets as kafka_offsets
from cdcflow.connectors.kafka import options as kafka_options
from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.kafka import reader as kafka_reader
from cdcflow.connectors.kafka.options import KafkaOptions, OffsetRange, TopicPartition
from cdcflow.formats import Message

BOOTSTRAP = {"kafka.bootstrap.servers": "broker:9092"}
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def parse(**options: str) -> KafkaOptions:
    return KafkaOptions.parse({**BOOTSTRAP, **{k.replace("_", "."): v for k, v in options.items()}})


# --- options -------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ({"subscribe": "a"}, "option 'kafka.bootstrap.servers' must be specified"),
    ({**BOOTSTRAP}, "exactly one of the options subscribe, subscribePattern, assign must be given (none is)"),
    ({**BOOTSTRAP, "subscribe": "a", "assign": '{"a":[0]}'}, "(subscribe, assign are)"),
    ({**BOOTSTRAP, "subscribe": " , "}, "option 'subscribe' names no topic"),
    ({**BOOTSTRAP, "subscribepattern": "a("}, "option 'subscribePattern': 'a(' is not a regex"),
    (
        {**BOOTSTRAP, "assign": "a:0"},
        """option 'assign': expected JSON like {"topicA":[0,1],"topicB":[2,4]}""",
    ),
    ({**BOOTSTRAP, "assign": '{"a": 0}'}, "topic 'a' must map to a list of partition numbers"),
    ({**BOOTSTRAP, "assign": '{"a": [-1]}'}, "topic 'a' must map to a list of partition numbers"),
    (
        {**BOOTSTRAP, "subscribe": "a", "startingoffsets": "first"},
        "option 'startingOffsets': 'first' is not earliest, latest or JSON offsets; write e.g. "
        """startingOffsets={"topicA":{"0":23,"1":-1},"topicB":{"0":-2}} (-2 is earliest, -1 latest)""",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "endingoffsets": '{"a": {"x": 1}}'},
        "(topic 'a': partition 'x' is not a partition number)",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "startingoffsets": '{"a": {"0": -3}}'},
        "offset -3 must be an offset >= 0",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "startingoffsets": '{"a": [0]}'},
        "topic 'a' must map partition numbers",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "failondataloss": "ture"},
        "option 'failOnDataLoss': 'ture' is not a boolean",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "includeheaders": "yes"},
        "option 'includeHeaders': 'yes' is not a boolean",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "kafkaconsumer.polltimeoutms": "0"},
        "option 'kafkaConsumer.pollTimeoutMs': '0' must be a positive integer",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "kafka.auto.offset.reset": "earliest"},
        "Kafka option 'kafka.auto.offset.reset' is not supported: set the source option startingOffsets",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "kafka.enable.auto.commit": "true"},
        "Kafka option 'kafka.enable.auto.commit' is not supported",
    ),
    (
        {**BOOTSTRAP, "subscribe": "a", "startingoffsetsbytimestamp": "{}"},
        "'startingOffsetsByTimestamp' is not supported by the cdcflow Kafka source",
    ),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=[m[:40] for _, m in BAD_OPTIONS])
def test_bad_options_are_rejected_naming_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConnectorOptionError) as error:
        KafkaOptions.parse(options)
    assert message in str(error.value)


def test_options_as_spark_passes_them() -> None:
    options = KafkaOptions.parse(
        {
            "kafka.bootstrap.servers": "h1:9092,h2:9092",
            "kafka.client.id": "me",
            "subscribe": "a, b,a",
            "startingoffsets": '{"a": {"0": 5, "1": -2}}',
            "failondataloss": "FALSE",
            "includeheaders": "true",
            "groupidprefix": "mine",
            "debezium-json.schema-include": "true",
        }
    )
    assert options.client.bootstrap_servers == "h1:9092,h2:9092"
    assert options.client.as_dict() == {"bootstrap.servers": "h1:9092,h2:9092", "client.id": "me"}
    assert options.subscription.topics == ("a", "b")
    assert options.starting_offsets is not None and options.starting_offsets.offsets == {A0: 5, A1: -2}
    assert options.ending_offsets is None
    assert (options.fail_on_data_loss, options.include_headers, options.group_id_prefix) == (
        False,
        True,
        "mine",
    )


def test_assign_and_pattern_subscriptions() -> None:
    assert parse(assign='{"b": [0], "a": [1, 0]}').subscription.partitions == (A0, A1, B0)
    pattern = parse(subscribePattern="cdc\\..*").subscription
    assert (pattern.kind, pattern.text) == ("subscribePattern", "cdc\\..*")


OAUTHBEARER = {
    "kafka.security.protocol": "SASL_PLAINTEXT",
    "kafka.sasl.mechanisms": "OAUTHBEARER",
    "kafka.enable.sasl.oauthbearer.unsecure.jwt": "true",
}


def test_secrets_stay_out_of_repr_and_errors() -> None:
    # librdkafka quotes an unparsable sasl.oauthbearer.config in the error it reports: a real leak path.
    secret, password = "hunter2 unsecured-jwt-config", "hunter3"  # noqa: S105 - made up
    options = KafkaOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "assign": '{"a": [0]}',
            "kafkaconsumer.polltimeoutms": "1000",
            **OAUTHBEARER,
            "kafka.sasl.oauthbearer.config": secret,
            "kafka.sasl.password": password,
        }
    )
    for shown in (repr(options), repr(options.client)):
        assert secret not in shown and password not in shown
        assert "sasl.oauthbearer.config=***, sasl.password=***" in shown
    with pytest.raises(KafkaConnectorError) as error:
        list(kafka_reader.read_range(options, OffsetRange("a", 0, 0, 5)))
    assert "Unrecognized sasl.oauthbearer.config beginning at: ***" in str(error.value)
    assert secret not in str(error.value)


def test_secrets_stay_out_of_client_setting_errors_and_librdkafka_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A password typed into the wrong setting: librdkafka quotes it in its error and its log lines.
    secret = "hunter2"  # noqa: S105 - a made-up password
    swapped = parse(
        subscribe="a",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_password=secret,
        kafka_sasl_mechanisms=secret,
    )
    with pytest.raises(ConnectorOptionError) as error:
        kafka_admin.offset_bounds(swapped, [])  # building the client checks the settings
    assert "Unsupported SASL mechanism: ***" in str(error.value)
    assert secret not in str(error.value)
    logged = parse(subscribe="a", kafka_sasl_password=secret, kafka_sasl_mechanisms=secret)
    with caplog.at_level(logging.WARNING, logger="cdcflow.connectors.kafka"):
        kafka_admin.offset_bounds(logged, [])
    assert "`sasl.mechanism` set to `***`" in caplog.text
    assert secret not in caplog.text


def test_a_repeated_librdkafka_line_is_logged_once_also_with_its_suppressed_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kafka_reader._OnceLogger, "last_logged", {})
    once = kafka_reader._OnceLogger(parse(subscribe="a").client.redacting(logging.getLogger("cdcflow.test")))
    refused = (
        "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
        "(after {}ms in state CONNECT{})"
    )
    with caplog.at_level(logging.WARNING, logger="cdcflow.test"):
        once.log(logging.WARNING, refused.format(0, ""))
        once.log(logging.WARNING, refused.format(1, ", 3 identical error(s) suppressed"))
        once.log(logging.WARNING, refused.format(2, ", 12 identical error(s) suppressed"))
        once.log(logging.WARNING, "127.0.0.1:1/bootstrap: Disconnected")
    assert caplog.text.count("Connection refused") == 1, caplog.text
    assert caplog.text.count("Disconnected") == 1


def test_an_unknown_client_setting_is_refused_with_librdkafkas_reason() -> None:
    with pytest.raises(ConnectorOptionError) as error:
        kafka_admin.offset_bounds(
            parse(subscribe="a", kafka_no_such_setting="x"), []
        )  # building the client checks
    assert 'No such configuration property: "no.such.setting"' in str(error.value)


DEFAULTS_AND_CHECKS = [
    ({}, "starting", "batch", "earliest"),
    ({}, "ending", "batch", "latest"),
    ({}, "starting", "streaming", "latest"),
    ({"startingOffsets": "earliest"}, "starting", "streaming", "earliest"),
    ({"startingOffsets": "latest"}, "starting", "batch", "can't be latest (-1) for batch queries"),
    ({"startingOffsets": '{"a": {"0": -1}}'}, "starting", "batch", "can't be latest (-1) for batch queries"),
    ({"endingOffsets": "earliest"}, "ending", "batch", "can't be earliest (-2) for batch queries"),
    ({"endingOffsets": '{"a": {"0": -2}}'}, "ending", "batch", "can't be earliest (-2) for batch queries"),
    ({"endingOffsets": "latest"}, "ending", "streaming", "'endingOffsets' is not valid in streaming queries"),
]


@pytest.mark.parametrize(("given", "which", "mode", "expected"), DEFAULTS_AND_CHECKS)
def test_offsets_defaults_and_checks_per_query_kind(
    given: dict[str, str], which: str, mode: str, expected: str
) -> None:
    options = KafkaOptions.parse({**BOOTSTRAP, "subscribe": "a", **given})
    if expected in ("earliest", "latest"):
        assert options.offsets_for(which, mode).kind == expected  # type: ignore[arg-type]
        return
    with pytest.raises(ConnectorOptionError) as error:
        options.offsets_for(which, mode)  # type: ignore[arg-type]
    assert expected in str(error.value)


# --- offsets and ranges, no Kafka ----------------------------------------------------------------


def test_offsets_json_round_trip_is_spark_shaped() -> None:
    offsets = {A1: 7, B0: 3, A0: 12}
    assert kafka_options.offsets_to_json(offsets) == {"a": {"0": 12, "1": 7}, "b": {"0": 3}}
    assert kafka_options.offsets_from_json(kafka_options.offsets_to_json(offsets)) == offsets


BOUNDS = {A0: (2, 10), A1: (0, 5)}


def test_resolve_offsets_earliest_latest_and_specific() -> None:
    earliest, latest = kafka_options.OffsetSpec("earliest"), kafka_options.OffsetSpec("latest")
    assert kafka_offsets.resolve_offsets(earliest, BOUNDS, which="starting") == {A0: 2, A1: 0}
    assert kafka_offsets.resolve_offsets(latest, BOUNDS, which="ending") == {A0: 10, A1: 5}
    specific = parse(subscribe="a", startingOffsets='{"a": {"0": -2, "1": 3}}').starting_offsets
    assert specific is not None
    assert kafka_offsets.resolve_offsets(specific, BOUNDS, which="starting") == {A0: 2, A1: 3}
    ending = parse(subscribe="a", endingOffsets='{"a": {"0": -1, "1": 4}}').ending_offsets
    assert ending is not None
    assert kafka_offsets.resolve_offsets(ending, BOUNDS, which="ending") == {A0: 10, A1: 4}


def test_specific_offsets_must_name_every_partition_read() -> None:
    spec = parse(subscribe="a", startingOffsets='{"a": {"0": 1}, "b": {"0": 1}}').starting_offsets
    assert spec is not None
    with pytest.raises(ConnectorOptionError) as error:
        kafka_offsets.resolve_offsets(spec, BOUNDS, which="starting")
    assert str(error.value) == (
        "option 'startingOffsets' must give an offset for every partition read (-2 earliest, -1 latest); "
        "missing: a-1; not read: b-0"
    )


def test_batch_ranges_reject_a_start_after_the_end() -> None:
    assert kafka_offsets.batch_ranges({A0: 2, A1: 5}, {A0: 10, A1: 5}) == [
        OffsetRange("a", 0, 2, 10),
        OffsetRange("a", 1, 5, 5),
    ]
    with pytest.raises(
        KafkaConnectorError, match="topic 'a' partition 0: starting offset 11 is after the ending"
    ):
        kafka_offsets.batch_ranges({A0: 11}, {A0: 10})


def test_stream_ranges_new_partitions_start_at_their_low_watermark() -> None:
    ranges = kafka_offsets.stream_ranges(
        {A0: 3}, {A0: 9, A1: 4}, new_partition_start={A1: 0}, fail_on_data_loss=True
    )
    assert ranges == [OffsetRange("a", 0, 3, 9), OffsetRange("a", 1, 0, 4)]


STREAM_LOSSES = [
    ({A0: 3}, {A0: 9, A1: 4}, {A1: 2}, "added partition a-1 starts from offset 2 instead of 0"),
    ({A0: 3}, {A0: 9, A1: 4}, {}, "cannot find the earliest offset of new partition a-1"),
    ({A0: 3, A1: 1}, {A0: 9}, {}, "partitions a-1 are gone"),
    ({A0: 9}, {A0: 3}, {}, "partition a-0's offset was changed from 9 to 3"),
]


@pytest.mark.parametrize(
    ("start", "end", "new", "problem"), STREAM_LOSSES, ids=[p for *_, p in STREAM_LOSSES]
)
def test_stream_ranges_report_data_loss_as_spark_does(
    start: kafka_options.Offsets,
    end: kafka_options.Offsets,
    new: kafka_options.Offsets,
    problem: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(DataLossError) as error:
        kafka_offsets.stream_ranges(start, end, new_partition_start=new, fail_on_data_loss=True)
    assert str(error.value).startswith(problem + ". Some data may have been lost")
    assert "set the source option failOnDataLoss=false" in str(error.value)
    with caplog.at_level(logging.WARNING):
        kafka_offsets.stream_ranges(start, end, new_partition_start=new, fail_on_data_loss=False)
    assert problem in caplog.text


def test_rate_limit_shares_the_limit_in_proportion_and_never_starves() -> None:
    start = {A0: 0, A1: 100, B0: 0}
    latest = {A0: 1000, A1: 101, B0: 0}
    # a-0 holds 1000 of 1001 records: 99 of 100; a-1's share (0.0999) rounds up to one record.
    assert kafka_offsets.rate_limit(100, start, latest) == {A0: 99, A1: 101, B0: 0}
    assert kafka_offsets.limit_offsets(
        {"a": {"0": 0}}, {"a": {"0": 50, "1": 50}}, 10, new_partition_start={A1: 0}
    ) == {"a": {"0": 5, "1": 5}}


def test_rate_limit_starts_new_partitions_at_their_earliest_offset() -> None:
    # a-1 is new and holds offsets [40, 50): 10 records against a-0's 50, so 1 of the 10 records a
    # trigger reads (from 40 on, as Spark's rateLimit does), not half of them from a phantom offset 0.
    start, latest = {"a": {"0": 0}}, {"a": {"0": 50, "1": 50}}
    assert kafka_offsets.limit_offsets(start, latest, 10, new_partition_start={A1: 40}) == {
        "a": {"0": 8, "1": 41}
    }
    # A new partition whose earliest offset is unknown (deleted meanwhile) is left at its latest
    # offset, for the planning of the batch to report (Spark: "let alert logic in getBatch handle it").
    assert kafka_offsets.limit_offsets(start, latest, 10, new_partition_start={}) == {"a": {"0": 10, "1": 50}}


SPLITS = [
    # Spark's KafkaOffsetRangeCalculatorSuite cases, then maxRecordsPerPartition.
    ([OffsetRange("a", 0, 1, 2), OffsetRange("a", 1, 1, 2)], None, 3, None),
    ([OffsetRange("a", 0, 1, 5)], None, 4, [(1, 2), (2, 3), (3, 4), (4, 5)]),
    ([OffsetRange("a", 0, 1, 5), OffsetRange("a", 1, 1, 21)], None, 3, [(1, 5), (1, 11), (11, 21)]),
    ([OffsetRange("a", 0, 1, 1), OffsetRange("a", 1, 1, 3)], None, None, [(1, 3)]),
    ([OffsetRange("a", 0, 0, 10)], 4, None, [(0, 3), (3, 6), (6, 10)]),
    (
        [OffsetRange("a", 0, 0, 10), OffsetRange("a", 1, 0, 2)],
        5,
        4,
        [(0, 2), (2, 5), (5, 7), (7, 10), (0, 2)],
    ),
]


@pytest.mark.parametrize(("ranges", "max_records", "min_partitions", "expected"), SPLITS)
def test_split_ranges_like_spark(
    ranges: list[OffsetRange],
    max_records: int | None,
    min_partitions: int | None,
    expected: list[tuple[int, int]] | None,
) -> None:
    pieces = kafka_offsets.split_ranges(ranges, max_records, min_partitions=min_partitions)
    assert [(p.start, p.end) for p in pieces] == (
        [(r.start, r.end) for r in ranges] if expected is None else expected
    )


# --- against a cluster ---------------------------------------------------------------------------


def keyed_messages(count: int, partitions: int) -> list[Message]:
    """Records with binary keys and headers, every fourth one a tombstone, round-robin over partitions."""
    return [
        Message(
            None if i % 4 == 3 else f'{{"n": {i}}}'.encode(),
            bytes([0, i, 255]),
            partition=i % partitions,
            timestamp_ms=1_700_000_000_000 + i,
            headers=(("trace", f"t{i}".encode()), ("empty", None)),
        )
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def filled_topic(kafka_cluster: KafkaCluster) -> tuple[str, list[Message]]:
    topic = unique_topic("client")
    kafka_cluster.create_topic(topic, 3)
    messages = keyed_messages(30, 3)
    assert kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic) == 30
    return topic, messages


def options_for(cluster: KafkaCluster, **extra: str) -> KafkaOptions:
    return KafkaOptions.parse(
        {
            "kafka.bootstrap.servers": cluster.bootstrap_servers,
            "kafkaconsumer.polltimeoutms": "20000",
            **extra,
        }
    )


def in_partition(messages: list[Message], topic: str, partition: int) -> list[Message]:
    """The messages as Kafka hands them back from one partition: with their topic and offsets."""
    mine = [m for m in messages if m.partition == partition]
    return [replace(m, topic=topic, offset=offset) for offset, m in enumerate(mine)]


@pytest.mark.integration
def test_discover_bounds_and_batch_offsets(
    kafka_cluster: KafkaCluster, filled_topic: tuple[str, list[Message]]
) -> None:
    topic, _ = filled_topic
    options = options_for(kafka_cluster, subscribe=topic)
    partitions = kafka_admin.discover_partitions(options)
    assert partitions == [TopicPartition(topic, p) for p in range(3)]
    assert kafka_admin.offset_bounds(options, partitions) == dict.fromkeys(partitions, (0, 10))
    assert kafka_admin.subscription_bounds(options) == dict.fromkeys(partitions, (0, 10))
    assert kafka_admin.batch_offsets(options, "starting") == dict.fromkeys(partitions, 0)
    assert kafka_admin.batch_offsets(options, "ending") == dict.fromkeys(partitions, 10)
    assert kafka_admin.latest_offsets(options) == dict.fromkeys(partitions, 10)
    assert kafka_admin.stream_starting_offsets(options) == dict.fromkeys(partitions, 10)
    json_start = options_for(
        kafka_cluster, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": 4, "1": -2, "2": -1}}}}'
    )
    assert kafka_admin.stream_starting_offsets(json_start) == {
        partitions[0]: 4,
        partitions[1]: 0,
        partitions[2]: 10,
    }


@pytest.mark.integration
def test_read_range_gives_every_record_exactly_in_offset_order(
    kafka_cluster: KafkaCluster, filled_topic: tuple[str, list[Message]]
) -> None:
    topic, messages = filled_topic
    options = options_for(kafka_cluster, subscribe=topic, includeHeaders="true")
    for partition in range(3):
        got = list(kafka_reader.read_range(options, OffsetRange(topic, partition, 0, 10)))
        assert got == in_partition(messages, topic, partition)
    middle = list(kafka_reader.read_range(options, OffsetRange(topic, 1, 3, 7)))
    assert middle == in_partition(messages, topic, 1)[3:7]
    assert list(kafka_reader.read_range(options, OffsetRange(topic, 1, 7, 7))) == []


@pytest.mark.integration
def test_headers_only_with_include_headers(
    kafka_cluster: KafkaCluster, filled_topic: tuple[str, list[Message]]
) -> None:
    topic, messages = filled_topic
    got = list(
        kafka_reader.read_range(options_for(kafka_cluster, subscribe=topic), OffsetRange(topic, 0, 0, 2))
    )
    assert [m.headers for m in got] == [(), ()]
    assert [m.value for m in got] == [m.value for m in in_partition(messages, topic, 0)[:2]]


@pytest.mark.integration
def test_split_pieces_read_back_to_the_whole_partition(
    kafka_cluster: KafkaCluster, filled_topic: tuple[str, list[Message]]
) -> None:
    topic, messages = filled_topic
    options = options_for(kafka_cluster, subscribe=topic, includeHeaders="true")
    ranges = kafka_offsets.batch_ranges(
        kafka_admin.batch_offsets(options, "starting"), kafka_admin.batch_offsets(options, "ending")
    )
    pieces = kafka_offsets.split_ranges(ranges, 3)
    assert len(pieces) == 12
    got = [m for piece in pieces for m in kafka_reader.read_range(options, piece)]
    assert got == [m for p in range(3) for m in in_partition(messages, topic, p)]


@pytest.mark.integration
def test_pattern_and_assign_subscriptions(kafka_cluster: KafkaCluster) -> None:
    prefix = unique_topic("pattern")
    for suffix, partitions in (("x", 2), ("y", 1)):
        kafka_cluster.create_topic(f"{prefix}.{suffix}", partitions)
    kafka_cluster.create_topic(f"{prefix}.x.not", 1)
    options = options_for(kafka_cluster, subscribePattern=f"{prefix}\\.[xy]")
    assert kafka_admin.discover_partitions(options) == [
        TopicPartition(f"{prefix}.x", 0),
        TopicPartition(f"{prefix}.x", 1),
        TopicPartition(f"{prefix}.y", 0),
    ]
    assigned = options_for(kafka_cluster, assign=f'{{"{prefix}.x": [1]}}')
    assert kafka_admin.discover_partitions(assigned) == [TopicPartition(f"{prefix}.x", 1)]
    assert kafka_admin.offset_bounds(assigned, kafka_admin.discover_partitions(assigned)) == {
        TopicPartition(f"{prefix}.x", 1): (0, 0)
    }
    assert kafka_admin.subscription_bounds(assigned) == {TopicPartition(f"{prefix}.x", 1): (0, 0)}
    assert set(kafka_admin.subscription_bounds(options)) == set(kafka_admin.discover_partitions(options))


@pytest.mark.integration
def test_missing_topics_and_partitions_are_named(kafka_cluster: KafkaCluster) -> None:
    missing = unique_topic("missing")
    with pytest.raises(KafkaConnectorError, match=f"topic\\(s\\) {missing} do not exist on"):
        kafka_admin.discover_partitions(options_for(kafka_cluster, subscribe=missing))
    with pytest.raises(
        KafkaConnectorError, match=f"could not get the offsets of topic '{missing}' partition 0"
    ):
        kafka_admin.offset_bounds(
            options_for(kafka_cluster, assign=f'{{"{missing}": [0]}}'), [TopicPartition(missing, 0)]
        )


@pytest.mark.integration
def test_sample_messages_reads_from_the_start(
    kafka_cluster: KafkaCluster, filled_topic: tuple[str, list[Message]]
) -> None:
    topic, messages = filled_topic
    sample = list(kafka_admin.sample_messages(options_for(kafka_cluster, subscribe=topic), 12))
    assert [(m.partition, m.offset) for m in sample] == [(0, o) for o in range(10)] + [(1, 0), (1, 1)]


@pytest.mark.integration
def test_records_deleted_below_the_range_are_data_loss(
    kafka_cluster: KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic = unique_topic("retention")
    kafka_cluster.create_topic(topic, 1)
    messages = [Message(f"v{i}".encode(), partition=0) for i in range(10)]
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    kafka_cluster.delete_records(topic, 0, 4)
    options = options_for(kafka_cluster, subscribe=topic)
    assert kafka_admin.offset_bounds(options, [TopicPartition(topic, 0)]) == {
        TopicPartition(topic, 0): (4, 10)
    }
    with pytest.raises(DataLossError) as error:
        list(kafka_reader.read_range(options, OffsetRange(topic, 0, 1, 10)))
    assert str(error.value).startswith(
        f"topic '{topic}' partition 0: cannot read offsets [1, 4), below the earliest available offset. "
    )
    assert "set the source option failOnDataLoss=false" in str(error.value)
    lenient = options_for(kafka_cluster, subscribe=topic, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING):
        got = list(kafka_reader.read_range(lenient, OffsetRange(topic, 0, 1, 10)))
    assert [m.offset for m in got] == list(range(4, 10))
    assert f"topic '{topic}' partition 0: cannot read offsets [1, 4)" in caplog.text
    assert list(kafka_reader.read_range(lenient, OffsetRange(topic, 0, 0, 3))) == []


@pytest.mark.integration
def test_a_range_past_the_end_of_the_partition_is_data_loss(
    kafka_cluster: KafkaCluster, filled_topic: tuple[str, list[Message]]
) -> None:
    topic, messages = filled_topic
    options = options_for(kafka_cluster, subscribe=topic)
    with pytest.raises(
        DataLossError, match=f"topic '{topic}' partition 2: cannot read offsets \\[10, 15\\), beyond"
    ):
        list(kafka_reader.read_range(options, OffsetRange(topic, 2, 8, 15)))
    lenient = options_for(kafka_cluster, subscribe=topic, failOnDataLoss="false")
    assert [m.offset for m in kafka_reader.read_range(lenient, OffsetRange(topic, 2, 8, 15))] == [8, 9]
    assert list(kafka_reader.read_range(lenient, OffsetRange(topic, 2, 12, 15))) == []


def test_ingest_gives_up_at_once_on_a_bootstrap_host_that_does_not_resolve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host name that does not resolve will not heal: the job fails naming it, well before the
    --kafka-timeout it would wait for brokers that are down (.invalid never resolves, RFC 2606)."""
    started = time.monotonic()
    code = main(
        [
            *("ingest", "--bootstrap-servers", "kafka-1.no-such-host.invalid:9092", "--topic", "orders"),
            *("--key", "id", "--schema", "id INT NOT NULL", "--kafka-timeout", "60s"),
            *("--target", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "c")),
        ]
    )
    elapsed = time.monotonic() - started
    error = capsys.readouterr().err.splitlines()[-1]
    assert code != 0 and elapsed < 15, (elapsed, error)
    host = "kafka-1.no-such-host.invalid"
    assert error.startswith(f"cdcflow: the Kafka bootstrap host(s) {host} do not resolve (")
    assert "check the host names in kafka.bootstrap.servers" in error


def test_unreachable_brokers_fail_naming_the_bootstrap_servers() -> None:
    options = KafkaOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "a", "kafkaconsumer.polltimeoutms": "1000"}
    )
    with pytest.raises(KafkaConnectorError) as listing:
        kafka_admin.discover_partitions(options)
    assert str(listing.value).startswith(
        "could not list the topics of Kafka at bootstrap servers 127.0.0.1:1"
    )
    with pytest.raises(KafkaConnectorError) as reading:
        list(kafka_reader.read_range(options, OffsetRange("a", 0, 0, 5)))
    assert str(reading.value).startswith(
        "topic 'a' partition 0 at offset 0 (reading [0, 5) from 127.0.0.1:1): no records within 1s; "
        "last error:"
    )
    assert "Connection refused" in str(reading.value)


@pytest.mark.integration
def test_producer_sink_writes_keys_values_headers_and_partitions(kafka_cluster: KafkaCluster) -> None:
    topic = unique_topic("sink")
    kafka_cluster.create_topic(topic, 2)
    config = kafka_admin.producer_config(
        {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "topic": topic}
    )
    with kafka_producer.KafkaProducerSink(config, topic) as sink:
        sink.produce(b"k1", b"v1", [("h", b"1")], partition=1)
        sink.produce(b"k2", None, partition=1)
        assert sink.flush() == 2
    options = options_for(kafka_cluster, subscribe=topic, includeHeaders="true")
    got = list(kafka_reader.read_range(options, OffsetRange(topic, 1, 0, 2)))
    assert [(m.key, m.value, m.headers) for m in got] == [(b"k1", b"v1", (("h", b"1"),)), (b"k2", None, ())]


def test_producer_sink_flush_reports_failed_deliveries() -> None:
    config = kafka_options.ClientConfig.of("127.0.0.1:1", message_timeout_ms="500")
    sink = kafka_producer.KafkaProducerSink(config, "events")
    sink.produce(b"k", b"v")
    with pytest.raises(KafkaConnectorError) as error:
        sink.flush()
    assert str(error.value).startswith(
        "1 record(s) could not be written to Kafka at 127.0.0.1:1: topic 'events': Local: Message timed out"
    )


def envelopes(topic: str, partition: int, count: int) -> list[Message]:
    return [
        Message(
            json.dumps({"op": "c", "after": {"id": i, "name": f"{topic}/{partition}"}}).encode(),
            partition=partition,
        )
        for i in range(count)
    ]


@pytest.mark.integration
def test_new_partitions_under_a_rate_limit_start_at_their_earliest_offset(
    kafka_cluster: KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic the pattern matches appears mid-stream with records already deleted below offset 25:
    micro-batches under maxOffsetsPerTrigger read it from 25 (reporting the added partition's start,
    as Spark does), never from 0, and keep the old partitions moving."""
    from cdcflow.connectors.spark.read_plan import plan_read
    from cdcflow.connectors.spark.readers import CdcStreamReader

    prefix = unique_topic("grow")
    old, new = f"{prefix}-a", f"{prefix}-b"
    kafka_cluster.create_topic(old, 2)
    kafka_producer.produce_messages(
        kafka_cluster.bootstrap_servers, envelopes(old, 0, 30) + envelopes(old, 1, 30), old
    )
    limit = 10
    plan = plan_read(
        "debezium-json",
        {
            "kafka.bootstrap.servers": kafka_cluster.bootstrap_servers,
            "subscribePattern": f"{prefix}-.*",
            "startingOffsets": "earliest",
            "failOnDataLoss": "false",
            "maxOffsetsPerTrigger": str(limit),
            "kafkaConsumer.pollTimeoutMs": "20000",
            "columns": "id INT NOT NULL, name STRING",
            "metadata": "topic,partition,offset",
        },
        None,
    )
    reader = CdcStreamReader(plan)
    read: list[tuple[str, int, int]] = []
    batches: list[list[tuple[str, int, int]]] = []

    def micro_batch(start: kafka_options.JsonOffsets) -> kafka_options.JsonOffsets:
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        rows = [r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()]
        batches.append([(r["topic"], r["partition"], r["offset"]) for r in rows])
        read.extend(batches[-1])
        return end

    start = micro_batch(reader.initialOffset())
    kafka_cluster.create_topic(new, 2)
    kafka_producer.produce_messages(
        kafka_cluster.bootstrap_servers, envelopes(new, 0, 40) + envelopes(new, 1, 5), new
    )
    kafka_cluster.delete_records(new, 0, 25)
    with caplog.at_level(logging.WARNING):
        for _ in range(30):
            end = micro_batch(start)
            if end == start:
                break
            start = end
    expected = (
        [(old, p, o) for p in (0, 1) for o in range(30)]
        + [(new, 0, o) for o in range(25, 40)]
        + [(new, 1, o) for o in range(5)]
    )
    assert sorted(read) == sorted(expected), "every record still in Kafka is read exactly once"
    sizes = [len(batch) for batch in batches]
    # Each micro-batch reads its share of the limit in real records (a share rounds down, or up
    # below one record: at most one record off per partition), until the topics are drained.
    assert all(limit - 4 <= size <= limit + 4 for size in sizes[: len(expected) // limit - 1]), sizes
    unread = {(old, 0): 30, (old, 1): 30}
    for batch in batches:
        for tp, left in unread.items():
            taken = sum(1 for t, p, _ in batch if (t, p) == tp)
            assert taken > 0 or left == 0, f"{tp} starved in micro-batch {sizes}"
            unread[tp] = left - taken
    losses = [r.getMessage() for r in caplog.records if "data may have been lost" in r.getMessage()]
    assert len(losses) == 1 and f"added partition {new}-0 starts from offset 25 instead of 0" in losses[0]
