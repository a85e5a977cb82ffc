"""``cdcflow ingest``: the command line of the lakehouse ingestion job (flags, or a TOML config file)."""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from cdcflow.cli.common import (
    DUMP_EXAMPLE,
    DURATION_HELP,
    CdcflowUsageError,
    add_input_flags,
    check_schema,
    kafka_timeout_option,
    key_values,
    merge_columns,
    parse_duration,
    spark_interval,
)
from cdcflow.formats.redact import redact, shown_entry

DEMO_DIR = "cdcflow-demo"
INTERRUPTED = 130
"""The exit code of a run Ctrl-C stopped (128 + SIGINT, as a shell reports it)."""
ISOLATED = 3
"""The exit code of a whole-database run that finished but isolated tables (``--on-table-error``)."""
T = TypeVar("T")
SETTINGS = (
    "format",
    "path",
    "bootstrap_servers",
    "topic",
    "schema",
    "key",
    "target",
    "checkpoint",
    "trigger",
    "interval",
    "sequence_by",
    "materialize",
    "upsert_key",
    "delete_retention",
    "state_ttl",
    "app_id",
    "on_truncate",
    "max_offsets_per_trigger",
    "max_bytes_per_trigger",
    "kafka_timeout",
    "backend",
    "delta_jars",
    "jars",
    "commit_group",
    "topic_pattern",
    "include_tables",
    "exclude_tables",
    "table_key",
    "mode",
    "table_mode",
    "on_table_error",
    "progress_json",
)


HELP = "the main job: apply a CDC topic or recording to a Delta table, exactly once"
DESCRIPTION = (
    "Read a CDC topic (Kafka) or a recorded topic dump with a cdc-* Spark source and apply "
    "its changelog to a Delta table by primary key, one merge per micro-batch, exactly once across "
    "restarts from the checkpoint. Without input it ingests the bundled recording of real Debezium "
    f"events from PostgreSQL into ./{DEMO_DIR}/table and prints the table."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a TOML file with these settings (flags win)")
    add_input_flags(
        parser,
        path_help="recorded files: a topic dump or envelopes (default: the bundled recording, as a demo)",
        format_help="debezium-json (default), debezium-avro-confluent, canal-json, ...",
        option_help="an option of the cdc-* source: connector (maxOffsetsPerTrigger=10000), Kafka "
        "(kafka.*, startingOffsets=...) or format (schema-include=true) keys; repeatable",
    )
    parser.add_argument(
        "--key",
        metavar="COLS",
        help="primary key columns, comma separated (default: the ones the messages name: Debezium's Kafka "
        "key, Canal's pkNames, Maxwell's primary_key_columns, OGG's primary_keys)",
    )
    parser.add_argument(
        "--target",
        metavar="DELTA_PATH",
        help="the Delta table (created on first write): a path, or s3://, abfss://, gs:// ...; with "
        "placeholders {db}, {schema}, {table}, {topic} (e.g. /lake/{db}/{table}) every table of the input "
        "lands in a table of its own (a whole database in one job)",
    )
    parser.add_argument(
        "--topic-pattern",
        metavar="REGEX",
        help="Kafka: every topic matching REGEX (new ones too, under --trigger continuous), each table to "
        "the --target its placeholders name",
    )
    parser.add_argument(
        "--include-tables",
        metavar="REGEX",
        help="a whole database: only the tables whose name (db.schema.table, or db.table) matches REGEX",
    )
    parser.add_argument(
        "--exclude-tables", metavar="REGEX", help="a whole database: leave out the tables matching REGEX"
    )
    parser.add_argument(
        "--table-key",
        action="append",
        metavar="TABLE=COLS",
        help="a whole database: the primary key of one table, e.g. 'inventory.items=id,sku' (repeatable; "
        "default: the key its messages name)",
    )
    parser.add_argument(
        "--mode",
        choices=["scd1", "scd2"],
        help="scd1 (default): the table holds each key's latest row; scd2: every version of each key, "
        "from __START_AT to __END_AT (the change's time: --sequence-by, Debezium default: its commit time)",
    )
    parser.add_argument(
        "--table-mode",
        action="append",
        metavar="TABLE=MODE",
        help="a whole database: --mode of one table, e.g. 'inventory.orders=scd2' (repeatable)",
    )
    parser.add_argument(
        "--checkpoint", metavar="DIR", help="the query's checkpoint (and key state): a path or s3a:// ..."
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="K=V",
        help="an object store option as delta-rs takes it: AWS_REGION=eu-west-1, AWS_ENDPOINT_URL=..., "
        "AZURE_STORAGE_ACCOUNT_NAME=...; repeatable (the environment's AWS_*, AZURE_* variables count too)",
    )
    parser.add_argument("--trigger", choices=["available-now", "continuous"], help="default available-now")
    parser.add_argument(
        "--interval", metavar="DURATION", help="micro-batch interval under --trigger continuous (default 1s)"
    )
    parser.add_argument(
        "--sequence-by",
        metavar="COLUMN",
        help="order each key's changes by this column (Debezium default: the log position); 'none' = off",
    )
    parser.add_argument("--materialize", choices=["auto", "force", "none"], help="upsert materialization")
    parser.add_argument("--upsert-key", metavar="COLS", help="the changelog's upsert key (default: --key)")
    parser.add_argument("--delete-retention", metavar="DURATION", help="tombstones kept (default 7d)")
    parser.add_argument(
        "--state-ttl", metavar="DURATION", help=f"key state kept after its last change ({DURATION_HELP})"
    )
    parser.add_argument("--app-id", help="Delta application id (default: from the checkpoint's query id)")
    parser.add_argument(
        "--on-truncate",
        choices=["apply", "ignore", "fail"],
        help="a TRUNCATE of the source table: apply (default) empties the Delta table, exactly once; "
        "ignore keeps its rows (logged); fail stops the job",
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        metavar="N",
        help="Kafka: at most N records per micro-batch (default 100000; 0 = no limit)",
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        metavar="BYTES",
        help="recorded files: about BYTES of input per micro-batch (default 64 MiB; 0 = no limit)",
    )
    parser.add_argument(
        "--backend",
        choices=["delta-rs", "spark"],
        help="who merges into Delta: delta-rs in the driver (default), or Spark with Delta Lake's jars "
        "(delta-spark), the merge running on the executors",
    )
    parser.add_argument(
        "--delta-jars",
        metavar="JARS",
        help="--backend spark in a local session: delta-spark's jars (files or folders, comma separated; "
        "default $CDCFLOW_DELTA_JARS); under spark-submit give --packages io.delta:delta-spark_2.13:4.4.0",
    )
    parser.add_argument(
        "--jars",
        metavar="JARS",
        help="jars (files or folders, comma separated) the local Spark session loads, e.g. hadoop-aws's for "
        "a checkpoint on S3 (scripts/java_deps.sh hadoop-aws); default $CDCFLOW_JARS",
    )
    parser.add_argument(
        "--commit-group",
        metavar="NAME",
        help="Kafka: commit each committed micro-batch's end offsets to consumer group NAME, so that "
        "kafka-consumer-groups and lag monitors show the lag (never read back: the checkpoint decides)",
    )
    parser.add_argument(
        "--on-table-error",
        choices=["stop", "isolate"],
        help="a whole database: a table that fails stops the job (default), or is isolated (its reason "
        "written next to its dead letters; the others go on; exit 3); a later run retries it",
    )
    parser.add_argument(
        "--progress-json",
        metavar="FILE",
        help="append one JSON object per applied micro-batch (per table: counts, lag, dead letters)",
    )
    parser.add_argument("--show", action="store_true", help="print the table at the end (demo default)")
    parser.set_defaults(command=run)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    if args.config:
        merged.update(_read_config(args.config))
    for name in SETTINGS:
        value = getattr(args, name, None)
        if value is not None:
            merged[name] = value
    options = _flat_options(merged.pop("options", None) or {})
    storage = _flat_options(merged.pop("storage_options", None) or {})
    args.config_options = options | storage  # the file's secrets, for the error messages of the command line
    merged["options"] = options | key_values(args.option, "schema-include=true")
    merge_columns(merged["options"], None, list(getattr(args, "metadata", None) or []))
    if merged.get("schema") and any(key.strip().lower() == "columns" for key in merged["options"]):
        raise CdcflowUsageError("give the columns once: --schema or --option columns=..., not both")
    if merged.get("schema"):
        check_schema(str(merged["schema"]))
    merged["storage_options"] = storage | _storage_options(getattr(args, "storage_option", None) or [])
    return merged


def _storage_options(entries: list[str]) -> dict[str, str]:
    """The ``--storage-option KEY=VALUE`` entries."""
    given: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise CdcflowUsageError(
                f"--storage-option '{shown_entry(entry)}' must look like KEY=VALUE, e.g. AWS_REGION=eu-west-1"
            )
        given[key.strip()] = value
    return given


def _flat_options(table: Any, prefix: str = "") -> dict[str, str]:
    """The config file's ``[options]``: TOML reads ``kafka.sasl.password = "..."`` as nested tables."""
    if not isinstance(table, dict):
        raise CdcflowUsageError('--config: options must be a table: [options] then lines like key = "value"')
    flat: dict[str, str] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flat_options(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def _read_config(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CdcflowUsageError(f"--config {path}: {error}") from None
    settings = {key.replace("-", "_"): value for key, value in data.items()}
    known = (*SETTINGS, "options", "storage_options", "table_keys", "table_modes")
    unknown = sorted(set(settings) - set(known))
    if unknown:
        valid = ", ".join(name.replace("_", "-") for name in known)
        raise CdcflowUsageError(f"--config {path}: unknown settings {', '.join(unknown)}; valid: {valid}")
    return settings


def config_from(merged: dict[str, Any]) -> tuple[Any, bool]:
    """The :class:`IngestConfig`, and whether it is the embedded demo."""
    from cdcflow.connectors.lakehouse.delta.batch import OnTruncate
    from cdcflow.connectors.lakehouse.delta.options import Materialize
    from cdcflow.connectors.lakehouse.ingest import IngestConfig

    demo = not merged.get("path") and not merged.get("bootstrap_servers")
    if demo:
        merged.setdefault("path", str(resources.files("cdcflow.examples").joinpath(DUMP_EXAMPLE)))
        merged["options"].setdefault("schema-include", "true")
        merged.setdefault("target", str(Path(DEMO_DIR) / "table"))
        merged.setdefault("checkpoint", str(Path(DEMO_DIR) / "checkpoint"))
    for required in ("target", "checkpoint"):
        if not merged.get(required):
            raise CdcflowUsageError(f"ingest needs --{required}")
    if merged.get("bootstrap_servers"):
        kafka_timeout_option(merged["options"], _duration(merged.get("kafka_timeout"), "kafka-timeout", None))
    topics = merged.get("topic") or ()
    table_keys = dict(_table_keys(merged.get("table_key") or []))
    table_keys.update({str(k): _names(v) for k, v in (merged.get("table_keys") or {}).items()})
    table_modes = dict(_table_modes(merged.get("table_mode") or []))
    table_modes.update(
        {str(k): _mode(v, f"[table-modes] {k}") for k, v in (merged.get("table_modes") or {}).items()}
    )
    return (
        IngestConfig(
            format=merged.get("format") or "debezium-json",
            key=_names(merged["key"]) if merged.get("key") else (),
            target=str(merged["target"]),
            checkpoint=str(merged["checkpoint"]),
            path=merged.get("path"),
            bootstrap_servers=merged.get("bootstrap_servers"),
            topics=tuple([topics] if isinstance(topics, str) else topics),
            schema=merged.get("schema"),
            options=merged["options"],
            trigger=merged.get("trigger") or "available-now",
            interval=_interval(merged.get("interval")),
            sequence_by=merged.get("sequence_by"),
            materialize=Materialize.parse(merged.get("materialize") or "auto"),
            upsert_key=_names(merged["upsert_key"]) if merged.get("upsert_key") else None,
            delete_retention=_duration(
                merged.get("delete_retention"), "delete-retention", IngestConfig.delete_retention, zero=True
            ),
            state_ttl=_duration(merged.get("state_ttl"), "state-ttl", None, zero=True),
            app_id=merged.get("app_id"),
            on_truncate=OnTruncate.parse(merged.get("on_truncate") or "apply"),
            max_offsets_per_trigger=_count(merged.get("max_offsets_per_trigger")),
            max_bytes_per_trigger=_count(merged.get("max_bytes_per_trigger")),
            backend=merged.get("backend") or "delta-rs",
            delta_jars=merged.get("delta_jars"),
            storage_options=merged.get("storage_options") or {},
            jars=merged.get("jars"),
            commit_group=merged.get("commit_group"),
            topic_pattern=merged.get("topic_pattern"),
            include_tables=merged.get("include_tables"),
            exclude_tables=merged.get("exclude_tables"),
            table_keys=table_keys,
            mode=_mode(merged.get("mode") or "scd1", "--mode"),
            table_modes=table_modes,
            on_table_error=merged.get("on_table_error") or "stop",
            progress_json=merged.get("progress_json"),
        ),
        demo,
    )


def _duration(value: Any, setting: str, default: T, *, zero: bool = False) -> timedelta | T:
    if value is None:
        return default
    return value if isinstance(value, timedelta) else parse_duration(value, setting, zero=zero)


def _interval(value: Any) -> str:
    """The trigger interval as Spark takes it. A text this syntax does not read but Spark may
    (``1 minute 30 seconds``, ``interval 2 weeks``) is passed on for Spark to judge, as before."""
    if value is None:
        return "1 second"
    try:
        duration = parse_duration(value, "--interval")
    except CdcflowUsageError:
        if isinstance(value, str) and " " in value.strip():
            return value.strip()
        raise
    return spark_interval(duration, "--interval")


def _table_keys(entries: Any) -> list[tuple[str, tuple[str, ...]]]:
    """``--table-key 'db.table=a,b'`` entries."""
    pairs = []
    for entry in [entries] if isinstance(entries, str) else entries:
        table, sep, columns = str(entry).partition("=")
        if not sep or not table.strip() or not _names(columns):
            raise CdcflowUsageError(
                f"--table-key {entry!r} must look like TABLE=COLUMNS, e.g. 'inventory.items=id,sku'"
            )
        pairs.append((table.strip(), _names(columns)))
    return pairs


def _table_modes(entries: Any) -> list[tuple[str, Any]]:
    """``--table-mode 'db.table=scd2'`` entries."""
    pairs = []
    for entry in [entries] if isinstance(entries, str) else entries:
        table, sep, mode = str(entry).partition("=")
        if not sep or not table.strip():
            raise CdcflowUsageError(
                f"--table-mode {entry!r} must look like TABLE=MODE, e.g. 'inventory.orders=scd2'"
            )
        pairs.append((table.strip(), _mode(mode, f"--table-mode {entry!r}")))
    return pairs


def _mode(value: Any, setting: str) -> Any:
    mode = str(value).strip().lower()
    if mode not in ("scd1", "scd2"):
        raise CdcflowUsageError(f"{setting}: the mode is scd1 or scd2, not {value!r}")
    return mode


def _names(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return tuple(str(item).strip() for item in items if str(item).strip())


def _count(value: Any) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise CdcflowUsageError(f"expected a whole number, not {value!r}") from None
    if number < 0:
        raise CdcflowUsageError(f"expected 0 (no limit) or a positive number, not {number}")
    return number


def run(args: argparse.Namespace) -> int:
    from cdcflow.connectors.lakehouse.ingest import ingest
    from cdcflow.connectors.spark.jobs import check_local_dir, spark_errors

    config, demo = config_from(settings(args))
    source = config.path or f"{config.bootstrap_servers} {config.topic_pattern or ','.join(config.topics)}"
    shown = f"{config.format} from {redact(source)} into {redact(config.target)}"
    print(f"cdcflow ingest: {shown}", file=sys.stderr)
    check_local_dir(config.checkpoint, "--checkpoint")
    check_local_dir(config.target, "--target")
    with spark_errors():
        summary = ingest(config, out=sys.stderr)  # its last line says what it did
    if summary.interrupted:
        return INTERRUPTED
    if summary.isolated_tables:
        return ISOLATED
    if (demo or args.show) and not summary.tables:
        print_table(config.target, summary.key, config.storage_options)
    return 0


def print_table(target: str, key: tuple[str, ...], storage_options: Mapping[str, str] | None = None) -> None:
    from deltalake import DeltaTable

    from cdcflow.connectors.lakehouse.delta.storage import Storage
    from cdcflow.connectors.lakehouse.delta.tables import read_table
    from cdcflow.core.render import format_value

    storage = Storage(dict(storage_options or {}))
    table = DeltaTable(target, storage_options=storage.table_options())
    rows = sorted(
        read_table(target, storage).to_pylist(), key=lambda r: tuple((r[k] is None, r[k]) for k in key)
    )
    names = [field.name for field in table.schema().fields]
    print(f"Delta table {target} (version {table.version()}, {len(rows)} rows): [{', '.join(names)}]")
    for row in rows:
        print("[" + ", ".join(_short(format_value(value)) for value in row.values()) + "]")


def _short(text: str, limit: int = 40) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else f"{text[: limit - 12]}…({len(text):,} chars)"
