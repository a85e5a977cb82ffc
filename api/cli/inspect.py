"""``cdcflow inspect``: the changelog of a file, a topic dump or a Kafka topic, printed Flink-style."""

from __future__ import annotations

import argparse
import base64
import json
import math
import sys
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import IO, Any

from cdcflow.cli.common import (
    EXAMPLE,
    CdcflowUsageError,
    add_input_flags,
    deprecated,
    is_kafka_option,
    kafka_timeout_option,
    key_values,
    merge_columns,
)
from cdcflow.core import CdcflowError, Change, ChangelogDataError, from_changelog
from cdcflow.core.render import float32_repr
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

HELP = "print the changelog of a file of change records"
DESCRIPTION = (
    "Read one JSON change record per line (flat records with an operation field, spec "
    "4.1.1) and print the changelog FROM_CHANGELOG makes of them, Flink-style (+I[5, name]); with "
    "--format, decode envelopes (a file, a topic dump or Kafka topics read to their end)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", help=argparse.SUPPRESS)  # deprecated: --path
    add_input_flags(
        parser,
        path_help=f"JSON-lines file or topic dump, '-' for stdin; default: the bundled {EXAMPLE}",
        format_help="decode each line as this envelope format (debezium-json, canal-json, maxwell-json, "
        "ogg-json, generic, upsert-kafka, ...) instead of flat change records",
        option_help="an option of the format by its Flink key, e.g. debezium-json.schema-include=true, "
        "with --bootstrap-servers also a Kafka option (kafka.security.protocol=SASL_SSL, "
        "startingOffsets=latest); repeatable",
    )
    parser.add_argument("--json", action="store_true", help='one {"kind": ..., "row": ...} object per line')
    parser.add_argument("--op", default="op", help="the field holding the operation code (default: op)")
    parser.add_argument(
        "--op-mapping",
        action="append",
        metavar="CODES=KINDS",
        help="map operation codes to row kinds, e.g. 'c, r=INSERT' or 'u=UPDATE_BEFORE, UPDATE_AFTER'; "
        "repeat for each entry (default: INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE)",
    )
    parser.add_argument(
        "--invalid-op-handling", default="FAIL", choices=["FAIL", "LOG", "SKIP"], type=str.upper
    )
    parser.add_argument(
        "--tables",
        action="store_true",
        help="with --format: list the tables the input holds (a folder of recorded topics, or topics) "
        "with their keys, columns and --target path, as a whole-database ingest routes them",
    )
    parser.add_argument(
        "--target", metavar="PATH", help="with --tables: the ingest's --target ({db}/{table})"
    )
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    if args.file is not None:
        deprecated("'inspect FILE'", "'inspect --path FILE'")
        if args.path is not None:
            raise CdcflowUsageError("give the input once: --path FILE")
        args.path = args.file
    return _inspect(args)


def _inspect(args: argparse.Namespace) -> int:
    if args.bootstrap_servers and not (args.format and args.topic):
        raise CdcflowError("inspecting Kafka needs --format and at least one --topic")
    if args.tables:
        return _inspect_tables(args)
    if args.format:
        return _inspect_format(args)
    mapping = _op_mapping(args.op_mapping)
    with _open(args.path) as (name, stream):
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
    merge_columns(options, args.schema, args.metadata)
    columns = _pop(options, "columns")
    metadata = [m.strip() for m in (_pop(options, "metadata") or "").split(",") if m.strip()]
    kafka = {key: value for key, value in options.items() if is_kafka_option(key)}
    if kafka and not args.bootstrap_servers:
        raise CdcflowUsageError("Kafka options (kafka.*, startingOffsets, ...) need --bootstrap-servers")
    options = {key: value for key, value in options.items() if key not in kafka}
    decoder = factory.create_decoder(options, parse_ddl(columns) if columns else None, metadata)
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
        where = (
            f"{letter.message.origin()}, field '{letter.field}'" if letter.field else letter.message.origin()
        )
        print(f"cdcflow: dead letter {where}: {letter.reason}", file=sys.stderr)
    print(f"cdcflow: {accounting_line(out.metrics)}", file=sys.stderr)
    return 0


def _inspect_tables(args: argparse.Namespace) -> int:
    """The routing of a whole-database ``ingest``, dry: each table, its key, columns and target."""
    import tempfile

    from cdcflow.connectors.lakehouse.database import TableSkipped, route, units
    from cdcflow.connectors.lakehouse.ingest import IngestConfig
    from cdcflow.connectors.spark.read_plan import EmptyInputError

    if not args.format or not (args.path or args.bootstrap_servers):
        raise CdcflowUsageError(
            "inspect --tables needs --format and --path DIR (or --bootstrap-servers and --topic)"
        )
    options = key_values(args.option, "schema-include=true")
    merge_columns(options, args.schema, args.metadata)
    config = IngestConfig(
        format=args.format,
        key=(),
        target=args.target or "{topic}",
        checkpoint=str(Path(tempfile.gettempdir()) / "cdcflow-inspect-tables"),  # never written
        path=args.path,
        bootstrap_servers=args.bootstrap_servers,
        topics=tuple(args.topic or ()),
        options=options,
    )
    failed = 0
    for name, topic, shared in units(config, {}):
        try:
            found = route(config, topic, shared)
        except TableSkipped:
            print(f"{name}: left out by --include/--exclude-tables")
            continue
        except EmptyInputError:
            print(f"{name}: no change yet")
            continue
        except CdcflowError as error:
            failed += 1
            print(f"{name}: cannot be ingested: {error}")
            continue
        key = ", ".join(found.config.key) + (", named by the messages" if found.named else "")
        print(f"{found.table.qualified}: topic {topic.name}, key ({key}), target {found.config.target}")
        print(f"    columns: {found.plan.decoded_columns.ddl()}")
    return 1 if failed else 0


def _pop(options: dict[str, str], name: str) -> str | None:
    """The connector option ``name`` (any case), taken out of the format's options."""
    for key in list(options):
        if key.strip().lower() == name:
            return options.pop(key)
    return None


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


def _messages(args: argparse.Namespace, kafka: dict[str, str]) -> Iterator[Message]:
    """The messages to inspect: a Kafka topic (read to its end now), a topic dump, or envelope lines."""
    if args.bootstrap_servers:
        import tempfile

        from cdcflow.connectors.replay.dumps import read_messages, record_topic

        options = {"kafka.bootstrap.servers": args.bootstrap_servers, "subscribe": ",".join(args.topic or [])}
        options.update(kafka)
        kafka_timeout_option(options, args.kafka_timeout)
        with tempfile.TemporaryDirectory(prefix="cdcflow-inspect-") as scratch:
            dump = str(Path(scratch) / "topic.dump.jsonl")
            record_topic(options, dump)
            yield from read_messages(dump)
        return
    with _open(args.path) as (name, stream):
        if args.path not in (None, "-"):
            from cdcflow.connectors.replay.dumps import is_dump, read_messages

            if is_dump(args.path):
                yield from read_messages(args.path)
                return
        for number, line in _lines(stream):
            yield Message(line, file=name, line=number)


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
            print(f"cdcflow: no --path given, inspecting the bundled example {EXAMPLE}", file=sys.stderr)
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
