"""The ``cdcflow`` command line: ``ingest`` (the main job), ``inspect``, ``record`` and ``stream``."""

from __future__ import annotations

import argparse
import base64
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
from cdcflow.formats import DecodeOutput, Decoder, Message, TypeKind, parse_ddl, render_change, resolve_format
from cdcflow.formats.jsonenc import float32_repr
from cdcflow.formats.redact import redact

EXAMPLE = "flat-changes.jsonl"
DUMP_EXAMPLE = "postgres-debezium.dump.jsonl"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.command(args))
    except CdcflowError as error:
        print(f"cdcflow: {redact(str(error), _given_options(args))}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _given_options(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The ``--option KEY=VALUE`` pairs of the command line, whose secrets no message may show."""
    return [
        (key, value)
        for key, _, value in (entry.partition("=") for entry in getattr(args, "option", None) or [])
    ]


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
        help="a format option by its Flink key, e.g. debezium-json.schema-include=true; repeatable",
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
    schema = parse_ddl(args.schema) if args.schema else None
    decoder = factory.create_decoder(options, schema, args.metadata)
    out = DecodeOutput()
    for message in _messages(args):
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
    metrics = out.metrics
    print(
        f"cdcflow: {metrics.messages} messages, {metrics.changes} changes, {metrics.tombstones} tombstones, "
        f"{metrics.events} side-output events, {metrics.filtered} filtered, "
        f"{metrics.dead_letters} dead letters",
        file=sys.stderr,
    )
    return 0


def _messages(args: argparse.Namespace) -> Iterator[Message]:
    """The messages to inspect: a Kafka topic (read to its end now), a topic dump, or envelope lines."""
    if args.bootstrap_servers:
        import tempfile

        from cdcflow.connectors.replay import read_messages, record_topic

        options = {"kafka.bootstrap.servers": args.bootstrap_servers, "subscribe": ",".join(args.topic)}
        with tempfile.TemporaryDirectory(prefix="cdcflow-inspect-") as scratch:
            dump = str(Path(scratch) / "topic.dump.jsonl")
            record_topic(options, dump)
            yield from read_messages(dump)
        return
    if args.file and args.file != "-" and Path(args.file).is_file():
        from cdcflow.connectors.replay import is_dump, read_messages

        if is_dump(args.file):
            yield from read_messages(args.file)
            return
    with _open(args.file) as (name, stream):
        for number, line in enumerate(stream, start=1):
            if line.strip():
                yield Message(line.encode("utf-8"), file=name, line=number)


def _record(args: argparse.Namespace) -> int:
    from cdcflow.connectors.replay import record_topic

    # librdkafka logs every failed connection attempt; the command reports the outcome once.
    logging.getLogger("cdcflow.connectors.kafka").setLevel(logging.CRITICAL)
    options = {"kafka.bootstrap.servers": args.bootstrap_servers}
    if args.topic:
        options["subscribe"] = ",".join(args.topic)
    options.update(key_values(args.option, "kafka.client.id=recorder"))
    summary = record_topic(options, args.output)
    print(f"cdcflow: {summary}", file=sys.stderr)
    return 0


def _stream(args: argparse.Namespace) -> int:
    import tempfile

    from cdcflow.connectors.job import local_session, stream_changelog

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
    with tempfile.TemporaryDirectory(prefix="cdcflow-checkpoint-") as scratch:
        spark = local_session()
        try:
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
            raise CdcflowError(f"--option '{entry}' must look like KEY=VALUE, e.g. {example}")
        options[key.strip()] = value
    return options


def _write_changes(changes: list[Change], decoder: Decoder, *, as_json: bool) -> None:
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
    """The input file, stdin, or the bundled example, as a context manager."""

    def __init__(self, file: str | None) -> None:
        self.file = file
        self._handle: IO[str] | None = None

    def __enter__(self) -> tuple[str, IO[str]]:
        if self.file == "-":
            return "<stdin>", sys.stdin
        if self.file is None:
            example = resources.files("cdcflow") / "examples" / EXAMPLE
            print(f"cdcflow: no FILE given, inspecting the bundled example {EXAMPLE}", file=sys.stderr)
            self._handle = example.open("r", encoding="utf-8")
            return EXAMPLE, self._handle
        path = Path(self.file)
        if not path.is_file():
            raise CdcflowError(f"{self.file}: no such file; pass a JSON-lines file of change records")
        self._handle = path.open("r", encoding="utf-8")
        return self.file, self._handle

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.close()


def _json_lines(name: str, stream: IO[str]) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
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
