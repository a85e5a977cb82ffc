"""What ``cdcflow ingest`` asks of its source beyond the user's options, and how the applier reads it.

- Bounded micro-batches: at most ``DEFAULT_MAX_OFFSETS_PER_TRIGGER`` Kafka records or about
  ``DEFAULT_MAX_BYTES_PER_TRIGGER`` bytes of recorded files per micro-batch, unless the user sets a limit
  (0 = none), since each batch is collected on the driver; a Kafka batch in input partitions of at
  most ``DEFAULT_RECORDS_PER_PARTITION`` records, so that every core decodes (a file's batch: in one
  range per core, ``minPartitions``, which the job sets from the session when it starts).
- Control events as rows (``controlEvents=emit``): the applier applies a TRUNCATE exactly once and
  counts the others.
- Where the format declares them (Debezium's do; the factory's options and metadata columns say so,
  never its name): ``changelog-mode=upsert`` (an update is its +U row: the merge needs no -U, and
  tables with PostgreSQL's REPLICA IDENTITY DEFAULT, whose updates have no before image, need no
  option); ``unavailable-values=REPORT`` with metadata ``unavailable-columns``, ``old-key`` and
  ``new-key``, so that the Delta merge keeps the target's value of every column Debezium did not
  send (durable, unlike a decoder's memory), also across primary-key changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.options import CONTROL_COLUMN
from cdcflow.formats.registry import resolve_format

DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
DEFAULT_MAX_BYTES_PER_TRIGGER = 64 << 20
#: Kafka input partitions of at most 50k records: a batch is decoded on every core.
DEFAULT_RECORDS_PER_PARTITION = 50_000
#: What the job set for recorded files before ``minPartitions``: how an uncommitted batch that such a
#: version logged is read again, and how files are split where the session's cores are unknown.
LEGACY_FILE_RECORDS_PER_PARTITION = 50_000
#: Format options the job sets where the format's option takes the value (and the user gave none).
FORMAT_DEFAULTS = (("unavailable-values", "REPORT"), ("changelog-mode", "upsert"))
#: Metadata the applier reads where the format has it: (metadata key, its column, the ApplyOptions field).
APPLIER_LINKS = (
    ("unavailable-columns", "unavailable_columns", "unavailable_column"),
    ("old-key", "old_key", "old_key_column"),
    ("new-key", "new_key", "new_key_column"),
)


@dataclass(frozen=True)
class SourceLinks:
    """The applier's view of the columns the job asked for: ``apply_options`` keywords, and the
    columns kept out of the table."""

    apply: Mapping[str, Any]
    exclude: tuple[str, ...]


def given_key(options: Mapping[str, str], *keys: str) -> str | None:
    """The user's spelling of the first of ``keys`` set in ``options`` (Spark keys are case-insensitive)."""
    wanted = {key.lower() for key in keys}
    return next((key for key in options if key.lower() in wanted), None)


def metadata_of(options: Mapping[str, str]) -> list[str]:
    """The metadata keys ``options`` asks for, in order."""
    key = given_key(options, "metadata")
    return [m.strip() for m in options[key].split(",") if m.strip()] if key is not None else []


def add_metadata(options: dict[str, str], *names: str) -> None:
    """Ask for the metadata ``names`` too (those not asked for already), under the user's spelling."""
    metadata = metadata_of(options)
    options[given_key(options, "metadata") or "metadata"] = ",".join(
        [*metadata, *(name for name in names if name not in metadata)]
    )


def _limit(name: str, flag: int | None) -> str | None:
    if flag is None:
        return None
    if flag < 0:
        raise ConnectorOptionError(f"{name} must be 0 (no limit) or a positive number, not {flag}")
    return str(flag)


def add_source_defaults(
    options: dict[str, str],
    format_name: str,
    *,
    kafka: bool,
    max_offsets_per_trigger: int | None,
    max_bytes_per_trigger: int | None,
) -> None:
    """Add the job's source options to ``options`` (the user's, as given), leaving the user's alone."""
    name, flag = (
        ("maxOffsetsPerTrigger", _limit("--max-offsets-per-trigger", max_offsets_per_trigger))
        if kafka
        else ("maxBytesPerTrigger", _limit("--max-bytes-per-trigger", max_bytes_per_trigger))
    )
    given = given_key(options, name)
    if given is not None and flag is not None:
        raise ConnectorOptionError(f"{name} is given twice, as a setting and as --option: keep one")
    if given is None:
        default = DEFAULT_MAX_OFFSETS_PER_TRIGGER if kafka else DEFAULT_MAX_BYTES_PER_TRIGGER
        options[name] = flag if flag is not None else str(default)
    if kafka and given_key(options, "maxRecordsPerPartition") is None:
        options["maxRecordsPerPartition"] = str(DEFAULT_RECORDS_PER_PARTITION)
    if given_key(options, "controlEvents") is None:
        options["controlEvents"] = "emit"
    factory = resolve_format(format_name)
    for key, value in FORMAT_DEFAULTS:
        declared = factory.options.accepts(key, value)
        if declared and given_key(options, key, f"{factory.options.prefix}.{key}") is None:
            options[key] = value
    links = applier_links(format_name)
    if links:
        add_metadata(options, *(key for key, _, _ in links))


def source_links(options: Mapping[str, str], format_name: str, requested_metadata: list[str]) -> SourceLinks:
    """What the applier needs to know of ``options`` (as :func:`add_source_defaults` left them)."""
    apply: dict[str, Any] = {}
    exclude: list[str] = []
    control = given_key(options, "controlEvents")
    if control is not None and options[control].strip().lower() == "emit":
        apply["control_column"] = CONTROL_COLUMN
        exclude.append(CONTROL_COLUMN)
    for key, column, field in applier_links(format_name):
        apply[field] = column
        if key not in requested_metadata:
            exclude.append(column)
    return SourceLinks(apply, tuple(exclude))


def applier_links(format_name: str) -> tuple[tuple[str, str, str], ...]:
    """The :data:`APPLIER_LINKS` whose metadata column the format declares."""
    factory = resolve_format(format_name)
    return tuple(link for link in APPLIER_LINKS if factory.has_metadata(link[0]))
