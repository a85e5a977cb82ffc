"""``cdcflow record``: Kafka topics written to a topic dump that the ``cdc-*`` sources replay."""

from __future__ import annotations

import argparse
import logging
import sys

from cdcflow.cli.common import (
    CdcflowUsageError,
    add_kafka_timeout,
    is_kafka_option,
    kafka_timeout_option,
    key_values,
)

HELP = "record Kafka topics into a topic dump file"
DESCRIPTION = (
    "Read every partition of the topics from startingOffsets (default earliest) up to the "
    "end offsets when recording starts, and write them to a topic dump (JSON lines, docs/replay.md) "
    "that the cdc-* sources replay with load(FILE)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT[,HOST:PORT]")
    parser.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="a topic; repeatable")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='a Kafka option of the cdc-* sources, e.g. startingOffsets={"orders":{"0":42}} or '
        "kafka.security.protocol=SSL; repeatable",
    )
    parser.add_argument("--output", required=True, metavar="FILE", help="the dump file to write")
    add_kafka_timeout(parser)
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    from cdcflow.connectors.replay.dumps import record_topic

    given = key_values(args.option, "kafka.client.id=recorder")
    others = [key for key in given if not is_kafka_option(key)]
    if others:
        raise CdcflowUsageError(
            f"--option {others[0]}: record takes Kafka options only (kafka.*, startingOffsets, "
            "endingOffsets, ...); format and connector options apply when the dump is read"
        )
    # librdkafka logs every failed connection attempt; the command reports the outcome once. Data loss
    # skipped under failOnDataLoss=false is still said (its logger is a child of the silenced one).
    logging.getLogger("cdcflow.connectors.kafka").setLevel(logging.CRITICAL)
    logging.getLogger("cdcflow.connectors.kafka.offsets").setLevel(logging.WARNING)
    options = {"kafka.bootstrap.servers": args.bootstrap_servers}
    if args.topic:
        options["subscribe"] = ",".join(args.topic)
    options.update(given)
    kafka_timeout_option(options, args.kafka_timeout)
    summary = record_topic(options, args.output)
    print(f"cdcflow: {summary}", file=sys.stderr)
    return 0
