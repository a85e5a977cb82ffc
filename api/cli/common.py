"""What the commands share: the flags of one vocabulary, durations, ``--option`` entries, usage errors."""

from __future__ import annotations

import argparse
import math
import re
import sys
from datetime import timedelta
from typing import Any

from cdcflow.core import CdcflowError
from cdcflow.formats.redact import shown_entry

EXAMPLE = "flat-changes.jsonl"
DUMP_EXAMPLE = "postgres-debezium.dump.jsonl"

KAFKA_TIMEOUT = timedelta(seconds=30)
"""How long a command waits for an unreachable Kafka cluster before it gives up (``--kafka-timeout``)."""
_KAFKA_TIMEOUT_KEY = "kafkaConsumer.pollTimeoutMs"
DURATION_HELP = "a duration: 30 (seconds), 500ms, 30s, 5m, 1h, 7d, or Spark's '1 second'"


class CdcflowUsageError(CdcflowError, ValueError):
    """A flag of the command line is missing or malformed (exit code 2)."""

    usage_error = True


_UNITS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_duration(text: Any, setting: str, *, zero: bool = False) -> timedelta:
    """One syntax for every duration of the command line and the config file: a number of seconds,
    a number with a unit (``500ms``, ``30s``, ``5m``, ``1h``, ``7d``) or Spark's ``1 second``; ``zero``
    accepts 0 (a setting where 0 has a meaning)."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        found = _DURATION.match(str(text))
        unit = (found.group(2).lower() if found else "") or "s"
        if unit not in _UNITS and unit.endswith("s"):
            unit = unit[:-1]  # seconds, minutes, hours, days
        if found is None or unit not in _UNITS:
            raise CdcflowUsageError(f"{setting}: expected {DURATION_HELP}, not {str(text)!r}")
        seconds = float(found.group(1)) * _UNITS[unit]
    if not (math.isfinite(seconds) and (seconds > 0 or (zero and seconds == 0))):
        raise CdcflowUsageError(f"{setting}: must be a positive duration, not {text!r}")
    return timedelta(seconds=seconds)


def spark_interval(duration: timedelta, setting: str) -> str:
    """``duration`` as Spark's trigger interval text (whole milliseconds)."""
    milliseconds = round(duration.total_seconds() * 1000)
    if milliseconds < 1:
        raise CdcflowUsageError(f"{setting}: at least 1ms, not {duration.total_seconds():g}s")
    return f"{milliseconds} milliseconds"


def kafka_timeout_option(options: dict[str, str], timeout: timedelta | None) -> None:
    """Bound every wait for Kafka by ``timeout`` (default :data:`KAFKA_TIMEOUT`) unless an option does."""
    if any(key.strip().lower() == _KAFKA_TIMEOUT_KEY.lower() for key in options):
        return
    limit = KAFKA_TIMEOUT if timeout is None else timeout
    options[_KAFKA_TIMEOUT_KEY] = str(max(1, round(limit.total_seconds() * 1000)))


def key_values(entries: list[str], example: str) -> dict[str, str]:
    """The ``--option KEY=VALUE`` entries as a dict; ``example`` shows a valid one in the error."""
    options = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise CdcflowUsageError(
                f"--option '{shown_entry(entry)}' must look like KEY=VALUE, e.g. {example}"
            )
        options[key.strip()] = value
    return options


def check_schema(ddl: str, flag: str = "--schema") -> None:
    """Fail before anything starts when the columns ``ddl`` do not parse: a usage error naming ``flag``."""
    from cdcflow.formats.errors import SchemaError
    from cdcflow.formats.types import parse_ddl

    try:
        parse_ddl(ddl)
    except SchemaError as error:
        raise CdcflowUsageError(f"{flag}: {error}") from None


def is_kafka_option(key: str) -> bool:
    """A key of the Kafka namespace of the ``cdc-*`` sources: ``kafka.*`` or a Kafka source option."""
    from cdcflow.connectors.kafka.options import SOURCE_OPTIONS, UNSUPPORTED_SOURCE_OPTIONS

    lowered = key.strip().lower()
    return lowered.startswith("kafka.") or lowered in SOURCE_OPTIONS or lowered in UNSUPPORTED_SOURCE_OPTIONS


def deprecated(old: str, new: str) -> None:
    """The one line an old spelling prints (on stderr, before anything else); it works for one release."""
    print(f"cdcflow: warning: {old} is deprecated; use {new} (the old form goes in 0.3)", file=sys.stderr)


def duration_flag(text: str) -> timedelta:
    """``parse_duration`` as an argparse type: a bad value is argparse's usage error (exit code 2)."""
    try:
        return parse_duration(text, "")
    except CdcflowUsageError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(": ")) from None


def add_kafka_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-timeout",
        type=duration_flag,
        metavar="DURATION",
        help=f"give up on unreachable Kafka brokers after DURATION (default 30s; {DURATION_HELP}); "
        f"the Kafka option {_KAFKA_TIMEOUT_KEY} sets it in milliseconds",
    )


def add_input_flags(
    parser: argparse.ArgumentParser, *, path_help: str, format_help: str, option_help: str
) -> None:
    """The flags inspect, stream and ingest spell alike: input, format, schema, metadata, options."""
    parser.add_argument("--path", metavar="FILE_OR_DIR", help=path_help)
    parser.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT[,HOST:PORT]", help="read Kafka topics instead of files"
    )
    parser.add_argument("--topic", action="append", metavar="TOPIC", help="a Kafka topic; repeatable")
    parser.add_argument("--format", help=format_help)
    parser.add_argument("--schema", metavar="DDL", help="the table's columns: 'id INT NOT NULL, name STRING'")
    parser.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY",
        help="add a metadata column of the format, e.g. source.table; repeatable",
    )
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help=option_help)
    add_kafka_timeout(parser)


def merge_columns(options: dict[str, str], schema: str | None, metadata: list[str]) -> None:
    """``--schema`` and ``--metadata`` as the ``cdc-*`` source options ``columns`` and ``metadata``."""
    given = {key.strip().lower(): key for key in options}
    if schema is not None:
        if "columns" in given:
            raise CdcflowUsageError("give the columns once: --schema or --option columns=..., not both")
        check_schema(schema)
        options["columns"] = schema
    elif "columns" in given:
        check_schema(options[given["columns"]], "--option columns")
    if metadata:
        if "metadata" in given:
            raise CdcflowUsageError("give the metadata once: --metadata or --option metadata=..., not both")
        options["metadata"] = ",".join(metadata)
