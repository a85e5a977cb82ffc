"""The ``cdcflow`` command line: ``ingest`` (the main job), ``inspect``, ``record`` and ``stream``."""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import IO, Any

from cdcflow.core import CdcflowError, Change, ChangelogDataError, from_changelog
from cdcflow.formats import (
    DecodeOutput,
    Decoder,
    FormatMetrics,
    Message,
    TypeKind,
    parse_ddl,
    render_change,
    resolve_format,
)
from cdcflow.formats.jsonenc import float32_repr
from cdcflow.formats.redact import entry_settings, redact, shown_entry

EXAMPLE = "flat-changes.jsonl"
DUMP_EXAMPLE = "postgres-debezium.dump.jsonl"


KAFKA_TIMEOUT_S = 30.0
"""How long a command waits for an unreachable Kafka cluster before it gives up (``--kafka-timeout``)."""
_KAFKA_TIMEOUT_KEY = "kafkaConsumer.pollTimeoutMs"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = _parse(parser, argv)
    _log_to_stderr()
    try:
        return int(args.command(args))
    except CdcflowError as error:
        print(f"cdcflow: {redact(str(error), _given_options(args))}", file=sys.stderr)
        return exit_code(error)
    except KeyboardInterrupt:
        print("cdcflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def exit_code(error: CdcflowError) -> int:
    """2 for a usage error (an option, flag or setting to fix), 1 for a failure of the run itself."""
    from cdcflow.connectors.errors import ConnectorOptionError
    from cdcflow.core.errors import ChangelogValidationError
    from cdcflow.formats.errors import FormatOptionError, UnknownFormatError

    usage = (ChangelogValidationError, FormatOptionError, UnknownFormatError, ConnectorOptionError)
    return 2 if isinstance(error, usage) or getattr(error, "usage_error", False) else 1


def _log_to_stderr() -> None:
    """Warnings of cdcflow and its clients as ``cdcflow: ...`` lines (Kafka clients log each once)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("cdcflow: %(message)s"))
    root = logging.getLogger("cdcflow")
    if not root.handlers:
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
        root.propagate = False
    # Py4J logs the traceback of a failed foreachBatch call and of a call cut short by Ctrl-C (some on
    # the root logger): the query's error, or the interrupted run's summary, says what happened.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    if not logging.root.handlers:
        other = logging.StreamHandler(sys.stderr)
        other.addFilter(lambda record: "py4j" not in record.pathname)
        logging.root.addHandler(other)


def kafka_timeout_option(options: dict[str, str], seconds: float | None) -> None:
    """Bound every wait for Kafka by ``seconds`` (default :data:`KAFKA_TIMEOUT_S`) unless an option does."""
    if any(key.strip().lower() == _KAFKA_TIMEOUT_KEY.lower() for key in options):
        return
    limit = KAFKA_TIMEOUT_S if seconds is None else seconds
    if not (limit > 0 and math.isfinite(limit)):
        raise CdcflowUsageError(f"--kafka-timeout must be a positive number of seconds, not {limit:g}")
    options[_KAFKA_TIMEOUT_KEY] = str(max(1, round(limit * 1000)))


class CdcflowUsageError(CdcflowError, ValueError):
    """A flag of the command line is missing or malformed (exit code 2)."""

    usage_error = True


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; argparse's errors echo some (unrecognized, bad choices): shown without secrets."""
    given = list(sys.argv[1:] if argv is None else argv)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(given)
    finally:
        sys.stderr.write(redact(errors.getvalue(), entry_settings(given)))
    args.given_arguments = given
    return args


def _given_options(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The settings of the command line and its config file, whose secrets no message may show."""
    given = entry_settings(getattr(args, "given_arguments", None) or getattr(args, "option", None) or [])
    return [*given, *dict(getattr(args, "config_options", None) or {}).items()]


def _kafka_timeout_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-timeout",
        type=float,
        metavar="SECONDS",
        help=f"give up on unreachable Kafka brokers after SECONDS (default {KAFKA_TIMEOUT_S:g}); the Kafka "
        f"option {_KAFKA_TIMEOUT_KEY} sets it in milliseconds",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdcflow", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    inspect = commands.add_parser(
        "inspect",
        help="print the changelog of a file of change records",
        description="Read one JSON change record per line (flat records with an operation field, spec "
        "4.1.1) and print the changelog FROM_CHANGELOG makes of them, Flink-style (+I[5, name]).",
    )
    inspect.add_argument(
        "file",
        nargs="?",
        help=f"JSON-lines file or topic dump (with --format), '-' for stdin; default: the bundled {EXAMPLE}",
    )
    inspect.add_argument("--json", action="store_true", help='one {"kind": ..., "row": ...} object per line')
    inspect.add_argument("--op", default="op", help="the field holding the operation code (default: op)")
    inspect.add_argument(
        "--op-mapping",
        action="append",
        metavar="CODES=KINDS",
        help="map operation codes to row kinds, e.g. 'c, r=INSERT' or 'u=UPDATE_BEFORE, UPDATE_AFTER'; "
        "repeat for each entry (default: INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE)",
    )
    inspect.add_argument(
        "--invalid-op-handling", default="FAIL", choices=["FAIL", "LOG", "SKIP"], type=str.upper
    )
    inspect.add_argument(
        "--format",
        help="decode each line as this envelope format (debezium-json, canal-json, maxwell-json, ogg-json, "
        "generic, upsert-kafka, ...) instead of flat change records",
    )
    inspect.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a format option by its Flink key, e.g. debezium-json.schema-include=true, or with "
        "--bootstrap-servers a Kafka option, e.g. kafka.security.protocol=SASL_SSL or "
        "startingOffsets=latest; repeatable",
    )
    inspect.add_argument(
        "--schema", help="the table schema as a Spark DDL string: 'id INT NOT NULL, name STRING'"
    )
    inspect.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY",
        help="add a metadata column of the format, e.g. source.table; repeatable",
    )
    inspect.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="inspect Kafka topics (read to their end) instead"
    )
    inspect.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="a topic; repeatable")
    _kafka_timeout_flag(inspect)
    inspect.set_defaults(command=_inspect)
    record = commands.add_parser(
        "record",
        help="record Kafka topics into a topic dump file",
        description="Read every partition of the topics from startingOffsets (default earliest) up to the "
        "end offsets when recording starts, and write them to a topic dump (JSON lines, docs/replay.md) "
        "that the cdc-* sources replay with load(FILE).",
    )
    record.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT[,HOST:PORT]")
    record.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="a topic; repeatable")
    record.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='a Kafka source option, e.g. startingOffsets={"orders":{"0":42}} or '
        "kafka.security.protocol=SSL; repeatable",
    )
    record.add_argument("--output", required=True, metavar="FILE", help="the dump file to write")
    _kafka_timeout_flag(record)
    record.set_defaults(command=_record)
    stream = commands.add_parser(
        "stream",
        help="print a changelog stream read through Spark",
        description="Read a changelog with a cdc-* Spark source, from Kafka or from recorded files, and "
        "print it until the input available at the start is read. Without input it replays the bundled "
        f"recording of real Debezium events from PostgreSQL ({DUMP_EXAMPLE}).",
    )
    stream.add_argument("path", nargs="?", help="recorded files: a topic dump or one envelope per line")
    stream.add_argument("--source", default="cdc-debezium", help="cdc-debezium (default), cdc-canal, ...")
    stream.add_argument("--bootstrap-servers", metavar="HOST:PORT[,HOST:PORT]", help="read Kafka instead")
    stream.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="a topic; repeatable")
    stream.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a source option: columns='id INT NOT NULL, ...', schema-include=true, startingOffsets=...",
    )
    stream.add_argument("--checkpoint", help="checkpoint directory (default: a temporary one)")
    _kafka_timeout_flag(stream)
    stream.set_defaults(command=_stream)
    from cdcflow import ingest_cli  # here: it imports this module's helpers

    ingest_cli.add_parser(commands)
    return parser


def _inspect(args: argparse.Namespace) -> int:
    if args.bootstrap_servers and not (args.format and args.topic):
        raise CdcflowError("inspecting Kafka needs --format and at least one --topic")
    if args.format:
        return _inspect_format(args)
    mapping = _op_mapping(args.op_mapping)
    with _open(args.file) as (name, stream):
        changes = from_changelog(
            _json_lines(name, stream),
            op=args.op,
            op_mapping=mapping,
            invalid_op_handling=args.invalid_op_handling,
        )
        out = sys.stdout
        for change in changes:
            out.write(json.dumps(change.to_json_obj(), default=_json_value) if args.json else str(change))
            out.write("\n")
    return 0


def _inspect_format(args: argparse.Namespace) -> int:
    factory = resolve_format(args.format)
    options = key_values(args.option, f"{args.format}.ignore-parse-errors=true")
    if args.bootstrap_servers:
        kafka = _kafka_options(options)
        options = {key: value for key, value in options.items() if key not in kafka}
    elif any(_is_kafka_option(key) for key in options):
        raise CdcflowUsageError("Kafka options (kafka.*, startingOffsets, ...) need --bootstrap-servers")
    schema = parse_ddl(args.schema) if args.schema else None
    decoder = factory.create_decoder(options, schema, args.metadata)
    out = DecodeOutput()
    for message in _messages(args, kafka if args.bootstrap_servers else {}):
        decoder.decode(message, out)
        _write_changes(out.changes, decoder, as_json=args.json)
        out.changes.clear()
    for event in out.events:
        print(
            f"cdcflow: {event.message.origin()}: {event.kind} event (side output, not a change)",
            file=sys.stderr,
        )
    for letter in out.dead_letters:
        print(f"cdcflow: dead letter {letter.message.origin()}: {letter.reason}", file=sys.stderr)
    print(f"cdcflow: {accounting_line(out.metrics)}", file=sys.stderr)
    return 0


def accounting_line(metrics: FormatMetrics) -> str:
    """What became of every message read; the outcomes add up to the messages unless one went missing."""
    line = (
        f"{metrics.messages} messages, {metrics.changes} changes: {metrics.changed_messages} with changes, "
        f"{metrics.dead_letters} dead letters ({metrics.internal_errors} internal errors), "
        f"{metrics.events} side-output events, {metrics.filtered} filtered, {metrics.tombstones} tombstones, "
        f"{metrics.empty} empty"
    )
    missing = metrics.unaccounted()
    return line if missing == 0 else f"{line}; UNACCOUNTED: {missing} messages (a cdcflow bug, please report)"


def _is_kafka_option(key: str) -> bool:
    from cdcflow.connectors.kafka_options import SOURCE_OPTIONS

    lowered = key.strip().lower()
    return lowered.startswith("kafka.") or lowered in SOURCE_OPTIONS


def _kafka_options(given: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in given.items() if _is_kafka_option(key)}


def _messages(args: argparse.Namespace, kafka: dict[str, str]) -> Iterator[Message]:
    """The messages to inspect: a Kafka topic (read to its end now), a topic dump, or envelope lines."""
    if args.bootstrap_servers:
        import tempfile

        from cdcflow.connectors.replay import read_messages, record_topic

        options = {"kafka.bootstrap.servers": args.bootstrap_servers, "subscribe": ",".join(args.topic)}
        options.update(kafka)
        kafka_timeout_option(options, args.kafka_timeout)
        with tempfile.TemporaryDirectory(prefix="cdcflow-inspect-") as scratch:
            dump = str(Path(scratch) / "topic.dump.jsonl")
            record_topic(options, dump)
            yield from read_messages(dump)
        return
    with _open(args.file) as (name, stream):
        if args.file not in (None, "-"):
            from cdcflow.connectors.replay import is_dump, read_messages

            if is_dump(args.file):
                yield from read_messages(args.file)
                return
        for number, line in _lines(stream):
            yield Message(line, file=name, line=number)


def _record(args: argparse.Namespace) -> int:
    from cdcflow.connectors.replay import record_topic

    # librdkafka logs every failed connection attempt; the command reports the outcome once.
    logging.getLogger("cdcflow.connectors.kafka").setLevel(logging.CRITICAL)
    options = {"kafka.bootstrap.servers": args.bootstrap_servers}
    if args.topic:
        options["subscribe"] = ",".join(args.topic)
    options.update(key_values(args.option, "kafka.client.id=recorder"))
    kafka_timeout_option(options, args.kafka_timeout)
    summary = record_topic(options, args.output)
    print(f"cdcflow: {summary}", file=sys.stderr)
    return 0


def _stream(args: argparse.Namespace) -> int:
    import tempfile

    from cdcflow.connectors.job import (
        check_local_dir,
        check_source,
        local_session,
        spark_errors,
        stream_changelog,
    )

    options = key_values(args.option, "schema-include=true")
    if args.bootstrap_servers:
        options["kafka.bootstrap.servers"] = args.bootstrap_servers
        options.setdefault("subscribe", ",".join(args.topic))
        options.setdefault("startingOffsets", "earliest")
    elif args.path:
        options["path"] = args.path
    else:
        example = resources.files("cdcflow.examples").joinpath(DUMP_EXAMPLE)
        options["path"] = str(example)
        options.setdefault("schema-include", "true")
    if any(key.strip().lower() == "kafka.bootstrap.servers" for key in options):
        kafka_timeout_option(options, args.kafka_timeout)
    if args.checkpoint:
        check_local_dir(args.checkpoint, "--checkpoint")
    check_source(args.source, options)
    with tempfile.TemporaryDirectory(prefix="cdcflow-checkpoint-") as scratch:
        spark = local_session()
        try:
            with spark_errors():
                batches = stream_changelog(spark, args.source, options, args.checkpoint or scratch)
        finally:
            spark.stop()
    print(f"cdcflow: {batches} micro-batch(es) read by {args.source}", file=sys.stderr)
    return 0


def key_values(entries: list[str], example: str) -> dict[str, str]:
    """The ``--option KEY=VALUE`` entries as a dict; ``example`` shows a valid one in the error."""
    options = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep:
            raise CdcflowError(f"--option '{shown_entry(entry)}' must look like KEY=VALUE, e.g. {example}")
        options[key.strip()] = value
    return options


def _write_changes(changes: list[Change], decoder: Decoder, *, as_json: bool) -> None:
    if not changes:
        return  # with schema-include, the decoder knows its columns once a message had a schema block
    out = sys.stdout
    # A FLOAT holds a 32-bit value: write its shortest text (0.8), as Flink does, not the double's.
    floats = {f.name for f in decoder.schema if f.type.kind is TypeKind.FLOAT}
    for change in changes:
        if as_json:
            row = {k: _float32(v) if k in floats else v for k, v in change.row.items()}
            obj = {"kind": change.kind.value, "row": row}
            out.write(json.dumps(obj, default=_json_value, ensure_ascii=False))
        else:
            out.write(render_change(change, decoder.schema))
        out.write("\n")


def _float32(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return float(float32_repr(value))
    return value


def _op_mapping(entries: list[str] | None) -> dict[str, str] | None:
    if not entries:
        return None
    mapping = {}
    for entry in entries:
        codes, sep, kinds = entry.rpartition("=")
        if not sep:
            raise CdcflowError(f"--op-mapping '{entry}' must look like CODES=KINDS, e.g. 'c, r=INSERT'")
        mapping[codes] = kinds
    return mapping


class _open:
    """The input file, stdin, or the bundled example, as a context manager over its bytes."""

    def __init__(self, file: str | None) -> None:
        self.file = file
        self._handle: IO[bytes] | None = None

    def __enter__(self) -> tuple[str, IO[bytes]]:
        if self.file == "-":
            return "<stdin>", sys.stdin.buffer
        if self.file is None:
            example = resources.files("cdcflow") / "examples" / EXAMPLE
            print(f"cdcflow: no FILE given, inspecting the bundled example {EXAMPLE}", file=sys.stderr)
            self._handle = example.open("rb")
            return EXAMPLE, self._handle
        path = Path(self.file)
        if not path.is_file():
            raise CdcflowUsageError(f"{self.file}: no such file; pass a JSON-lines file of change records")
        self._handle = path.open("rb")
        return self.file, self._handle

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.close()


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines and their numbers, as the Spark sources read files: a line ends at ``\\n``
    only (``\\r\\n`` is stripped, a ``\\r`` inside a line is data) and its bytes are kept as they are."""
    for number, line in enumerate(stream, start=1):
        if line.strip():
            yield number, line.rstrip(b"\r\n")


def _json_lines(name: str, stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    for number, line in _lines(stream):
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ChangelogDataError(
                f"{name}:{number}: not valid UTF-8 (byte 0x{line[error.start]:02x} at byte "
                f"{error.start + 1}); each line must hold one JSON object in UTF-8"
            ) from None
        except json.JSONDecodeError as error:
            raise ChangelogDataError(
                f"{name}:{number}: not valid JSON ({error.msg} at column {error.colno}); each line must "
                "hold one JSON object"
            ) from None
        if not isinstance(record, dict):
            raise ChangelogDataError(
                f"{name}:{number}: expected a JSON object per line, got {type(record).__name__}"
            )
        yield record


def _json_value(value: Any) -> Any:
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
