"""``generic``: flat JSON rows that carry their own operation code (FROM_CHANGELOG's flat mode).

A message is one row with an op column, ``{"id": 1, "name": "a", "op": "INSERT"}``, or a deletion
flag, ``{"id": 1, "deleted": "false"}`` (spec 4.1.3.7-4.1.3.9), or the output of Debezium's
``ExtractNewRecordState`` transform (``__op`` and/or ``__deleted``: ``preset=debezium-unwrap``).

``op-mapping`` is written ``codes=KINDS;codes=KINDS``, each side a comma list, e.g.
``c,r=INSERT;u=UPDATE_AFTER;d=DELETE`` or ``false=INSERT,UPDATE_AFTER;true=DELETE``; it is checked
once by the core's op_mapping rules. Without it the codes are the row kind names themselves.

The op column is consumed: it is not in the output unless the declared schema has a column of that
name (then it is passed through with the row). Mappings that group INSERT with UPDATE_AFTER, or build
``-U`` rows, need each key's last row: they need ``key-columns`` and keep state per key.

The encoder is TO_CHANGELOG's flat form with the inverse mapping (the first code of each entry):
the row's columns, then the op column. Without ``op-mapping`` it writes INSERT, UPDATE_AFTER and
DELETE and leaves ``-U`` out (counted in ``dropped_update_before``), as the core's flat default does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from cdcflow.core.errors import ChangelogValidationError, InvalidOperationError
from cdcflow.core.from_changelog_engine import FromChangelog
from cdcflow.core.model import Change, ChangelogMetrics, Rejected
from cdcflow.core.opmapping import FromOpMapping, parse_from_op_mapping
from cdcflow.core.params import FromChangelogParams, InvalidOpHandling, plan_from_changelog, plan_to_changelog
from cdcflow.core.rowkind import DEL, INS, UA, UB, RowKind
from cdcflow.core.to_changelog_engine import ToChangelog
from cdcflow.formats.base import (
    SCHEMA_INCLUDE,
    Decoded,
    Decoder,
    Encoded,
    Encoder,
    FormatMetrics,
    Message,
    connect_payload,
    parse_json_object,
)
from cdcflow.formats.errors import FieldError, FormatOptionError, SkippedRecord, excerpt
from cdcflow.formats.json_decode import RowConverter
from cdcflow.formats.json_encode import IGNORE_PARSE_ERRORS, TIMESTAMP_STANDARD, RowEncoder, TimestampStandard
from cdcflow.formats.options import Option, OptionSet, choice, integer, names, optional_string
from cdcflow.formats.registry import FormatFactory
from cdcflow.formats.types import Field, Schema

NAME = "generic"
logger = logging.getLogger(__name__)


class Preset(Enum):
    NONE = "none"
    DEBEZIUM_UNWRAP = "debezium-unwrap"


@dataclass(frozen=True)
class _PresetDefaults:
    op_field: str
    op_mapping: str | None
    deleted_field: str | None


PRESETS = {
    Preset.NONE: _PresetDefaults("op", None, None),
    Preset.DEBEZIUM_UNWRAP: _PresetDefaults("__op", "c,r=INSERT;u=UPDATE_AFTER;d=DELETE", "__deleted"),
}

OPTIONS = OptionSet(
    NAME,
    [
        Option(
            "preset",
            choice(Preset),
            Preset.NONE,
            "none, or debezium-unwrap (Debezium's ExtractNewRecordState output: op-field __op, op-mapping "
            "c,r=INSERT;u=UPDATE_AFTER;d=DELETE, deleted-field __deleted)",
        ),
        Option("op-field", optional_string, None, "the field holding the operation code (default op)"),
        Option(
            "op-mapping",
            optional_string,
            None,
            "codes=KINDS entries separated by ';', each side a comma list, e.g. "
            "c,r=INSERT;u=UPDATE_AFTER;d=DELETE (default: the codes are the row kind names)",
        ),
        Option(
            "deleted-field",
            optional_string,
            None,
            "a true/false deletion flag read when the op field is absent: true is the op-mapping's "
            "DELETE code, false its update code",
        ),
        Option(
            "invalid-op-handling",
            choice(InvalidOpHandling),
            InvalidOpHandling.FAIL,
            "an op code op-mapping does not know: FAIL the record, or LOG / SKIP it to the dead letters",
        ),
        Option(
            "key-columns",
            names,
            (),
            "primary-key columns: the Kafka key on encode; needed by mappings that keep per-key state",
        ),
        Option(
            "state-ttl",
            integer,
            0,
            "seconds a key's last row is kept by mappings that need it (0: forever)",
        ),
        SCHEMA_INCLUDE,
        IGNORE_PARSE_ERRORS,
        TIMESTAMP_STANDARD,
    ],
)

_UPSERT_PREFERENCE = (
    frozenset({UA}),
    frozenset({INS, UA}),
    frozenset({INS, UB, UA}),
    frozenset({UB, UA}),
)


def parse_op_mapping_text(text: str) -> list[tuple[str, str]]:
    """``c,r=INSERT;d=DELETE`` → ``[("c,r", "INSERT"), ("d", "DELETE")]`` (the core's ARRAY form)."""
    entries = []
    for entry in text.split(";"):
        if not entry.strip():
            continue
        codes, equals, kinds = entry.partition("=")
        if not equals or "=" in kinds:
            raise FormatOptionError(
                f"option '{NAME}.op-mapping': entry '{entry.strip()}' must be codes=KINDS with one '=', "
                "e.g. c,r=INSERT;u=UPDATE_AFTER;d=DELETE"
            )
        entries.append((codes, kinds))
    if not entries:
        raise FormatOptionError(
            f"option '{NAME}.op-mapping' is empty: leave it out to use the row kind names as codes"
        )
    return entries


def _needs_state(mapping: FromOpMapping) -> list[str]:
    """The codes whose row kinds need each key's last row when there is no before image."""
    return [code for code, kinds in mapping.groups.items() if UA in kinds and (INS in kinds or UB in kinds)]


def _first_code(mapping: FromOpMapping, groups: Sequence[frozenset[RowKind]]) -> str | None:
    for group in groups:
        for code, kinds in mapping.groups.items():
            if kinds == group:
                return code
    return None


def inverse_mapping(mapping: FromOpMapping) -> dict[str, str] | None:
    """The to_changelog mapping writing the first code of each from_changelog entry (None: default)."""
    if mapping.is_default:
        return None
    entries: dict[str, str] = {}
    for code, kinds in mapping.groups.items():
        entries.setdefault(", ".join(kind.name for kind in RowKind if kind in kinds), code)
    return entries


@dataclass(frozen=True)
class GenericConfig:
    schema: Schema
    params: FromChangelogParams
    deleted_field: str | None = None
    delete_code: str | None = None
    upsert_code: str | None = None
    key_columns: tuple[str, ...] = ()
    schema_include: bool = False
    ignore_parse_errors: bool = False
    timestamp_standard: TimestampStandard = TimestampStandard.SQL

    @property
    def op_field(self) -> str:
        return self.params.op

    @property
    def op_declared(self) -> bool:
        return self.params.op in self.schema

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: Schema) -> GenericConfig:
        values = OPTIONS.parse(options)
        preset = PRESETS[values["preset"]]
        op_field = values["op-field"] or preset.op_field
        mapping_text = values["op-mapping"] or preset.op_mapping
        deleted_field = values["deleted-field"] or preset.deleted_field
        key_columns = values["key-columns"]
        for column in key_columns:
            if column not in schema:
                raise FormatOptionError(
                    f"option '{NAME}.key-columns': '{column}' is not a column of the schema ({schema.names})"
                )
        if values["state-ttl"] < 0:
            raise FormatOptionError(f"option '{NAME}.state-ttl' must be 0 (forever) or more seconds")
        entries = parse_op_mapping_text(mapping_text) if mapping_text is not None else None
        try:
            mapping = parse_from_op_mapping(entries)
        except ChangelogValidationError as error:
            raise FormatOptionError(f"option '{NAME}.op-mapping' ('{mapping_text}'): {error}") from None
        stateful_codes = _needs_state(mapping)
        if stateful_codes and not key_columns:
            raise FormatOptionError(
                f"option '{NAME}.op-mapping' maps the code(s) {stateful_codes} to row kinds the row alone "
                "cannot tell (INSERT or UPDATE_AFTER, or a -U row without a before image): that needs "
                f"each key's last row, so set '{NAME}.key-columns' to the primary key"
            )
        try:
            params = plan_from_changelog(
                op=op_field,
                op_mapping=entries,
                invalid_op_handling=values["invalid-op-handling"],
                partition_by=key_columns or None,
                state_ttl=values["state-ttl"] if stateful_codes else None,
                passthrough=op_field if op_field in schema else None,
            )
        except ChangelogValidationError as error:
            raise FormatOptionError(f"format '{NAME}': {error}") from None
        delete_code = upsert_code = None
        if deleted_field is not None:
            delete_code = _first_code(mapping, [frozenset({DEL})])
            upsert_code = _first_code(mapping, _UPSERT_PREFERENCE)
            if delete_code is None or upsert_code is None:
                raise FormatOptionError(
                    f"option '{NAME}.deleted-field' needs op-mapping codes for DELETE and for UPDATE_AFTER "
                    f"(the flag's true and false), but '{NAME}.op-mapping' is {mapping_text or 'the default'}"
                )
            if deleted_field == op_field:
                raise FormatOptionError(
                    f"options '{NAME}.deleted-field' and '{NAME}.op-field' both name '{op_field}'; to "
                    "read a deletion flag as the op code, set op-field alone with op-mapping "
                    "'false=...;true=DELETE'"
                )
        return cls(
            schema=schema,
            params=params,
            deleted_field=deleted_field,
            delete_code=delete_code,
            upsert_code=upsert_code,
            key_columns=key_columns,
            schema_include=values["schema-include"],
            ignore_parse_errors=values["ignore-parse-errors"],
            timestamp_standard=values["timestamp-format.standard"],
        )


class GenericDecoder(Decoder):
    """Converts the declared columns, then hands ``{**row, op: code}`` to FROM_CHANGELOG (flat mode).

    Unknown codes under ``invalid-op-handling`` LOG or SKIP go to the dead letters with their bytes.
    """

    format_name = NAME

    def __init__(self, config: GenericConfig) -> None:
        super().__init__(ignore_parse_errors=config.ignore_parse_errors)
        self.config = config
        self.schema = config.schema
        # A NULL in a NOT NULL column fails its record here, not the query at the sink; a key column's
        # is checked after FROM_CHANGELOG, which names it first when it keys state (an upsert).
        keys = set(config.key_columns)
        self._rows = RowConverter(
            Schema(tuple(Field(f.name, f.type) if f.name in keys else f for f in config.schema)),
            enforce_not_null=True,
        )
        self._not_null_keys = tuple(f.name for f in config.schema if f.name in keys and not f.nullable)
        self._engine = FromChangelog(
            config.params, metrics=ChangelogMetrics(keep_rejected=0), on_reject=self._on_reject
        )
        self._known = sorted(config.params.op_mapping.groups)
        self._rejected: Rejected | None = None

    def __reduce__(self) -> tuple[Callable[..., GenericDecoder], tuple[GenericConfig]]:
        return type(self), (self.config,)

    def _on_reject(self, rejected: Rejected) -> None:
        self._rejected = rejected

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        assert message.value is not None  # noqa: S101 - the base class skips tombstones
        config = self.config
        op_field = config.op_field
        obj, _ = connect_payload(
            parse_json_object(message.value, "a generic row"),
            schema_include=config.schema_include,
            format_name=NAME,
            marker=op_field,
        )
        row = self._rows.convert(obj)
        code = row[op_field] if config.op_declared else obj.get(op_field)
        derived = code is None and config.deleted_field is not None
        if derived:
            code = self._flag_code(obj)
        if code is None:
            raise FieldError(
                op_field,
                "the operation code is missing or null; set "
                f"'{NAME}.op-field' to the field that holds it"
                + (f", or send a '{config.deleted_field}' flag" if config.deleted_field else ""),
            )
        if isinstance(code, (dict, list)):
            raise FieldError(op_field, f"the operation code must be text, got {excerpt(code)}")
        row[op_field] = code
        self._rejected = None
        try:
            changes = self._engine.process(row)
        except InvalidOperationError:
            raise FieldError(
                op_field,
                f"unknown operation code {excerpt(code)}; op-mapping knows {self._known}: add it to "
                f"'{NAME}.op-mapping', or set '{NAME}.invalid-op-handling' to LOG or SKIP to dead-letter "
                "such records",
            ) from None
        if self._rejected is not None:
            raise SkippedRecord(
                op_field,
                f"unknown operation code {excerpt(code)} (op-mapping knows {self._known}); skipped by "
                f"'{NAME}.invalid-op-handling'={config.params.invalid_op_handling.value}",
            )
        if derived and config.op_declared:
            for change in changes:
                change.row[op_field] = None
        for change in changes:
            for column in self._not_null_keys:
                if change.row.get(column) is None:
                    raise FieldError(column, "is NULL or missing, but the column is declared NOT NULL")
        return changes

    def _flag_code(self, obj: Mapping[str, Any]) -> str | None:
        field = self.config.deleted_field
        assert field is not None  # noqa: S101 - called only with a deleted field
        flag = obj.get(field)
        if flag is None:
            return None
        if flag is True or (isinstance(flag, str) and flag.strip().lower() == "true"):
            return self.config.delete_code
        if flag is False or (isinstance(flag, str) and flag.strip().lower() == "false"):
            return self.config.upsert_code
        raise FieldError(field, f"the deletion flag must be true or false, got {excerpt(flag)}")


class GenericEncoder(Encoder):
    """Writes ``{...row, op: code}`` (and the deletion flag when one is configured and not a column).

    The Kafka key is the key columns as a JSON object, or None without key columns.
    """

    format_name = NAME

    def __init__(self, config: GenericConfig, key_columns: Sequence[str]) -> None:
        self.config = config
        self.key_columns = tuple(key_columns)
        op_field = config.op_field
        self._engine = ToChangelog(
            plan_to_changelog(
                op=op_field,
                op_mapping=inverse_mapping(config.params.op_mapping),
                partition_by=self.key_columns or None,
                produces_full_deletes=True,
            )
        )
        self._mapping = self._engine.params.op_mapping
        row_schema = Schema(tuple(f for f in config.schema if f.name != op_field))
        self._rows = RowEncoder(row_schema, config.timestamp_standard)
        self._flag = (
            config.deleted_field
            if config.deleted_field is not None and config.deleted_field not in config.schema
            else None
        )
        key_schema = config.schema.select(self.key_columns) if self.key_columns else None
        self._keys = RowEncoder(key_schema, config.timestamp_standard) if key_schema is not None else None
        self._drops_update_before = self._mapping.is_default or self._mapping.code_for(UB) is None
        #: ``-U`` rows the mapping has no code for (an upsert stream does not need them).
        self.dropped_update_before = 0

    def encode(self, change: Change) -> list[Encoded]:
        if change.kind is UB and self._drops_update_before:
            self.dropped_update_before += 1
            return []
        row = change.row
        if self.config.op_declared:
            row = {k: v for k, v in row.items() if k != self.config.op_field}
        return [self._serialise(envelope) for envelope in self._engine.process(Change(change.kind, row))]

    def flush(self) -> list[Encoded]:
        return [self._serialise(envelope) for envelope in self._engine.flush()]

    @property
    def pairs_updates(self) -> bool:
        return self._mapping.combines_updates

    def _serialise(self, envelope: dict[str, Any]) -> Encoded:
        op_field = self.config.op_field
        code = envelope[op_field]
        value = self._rows.encode(envelope)
        value[op_field] = code
        if self._flag is not None:
            value[self._flag] = "true" if code == self.config.delete_code else "false"
        key = orjson.dumps(self._keys.encode(envelope)) if self._keys is not None else None
        return Encoded(key, orjson.dumps(value))


class GenericFormat(FormatFactory):
    name = NAME
    spark_source = "cdc-generic"
    options = OPTIONS

    def create_decoder(
        self, options: Mapping[str, str], schema: Schema | None = None, metadata: Sequence[str] = ()
    ) -> GenericDecoder:
        if metadata:
            raise FormatOptionError(
                f"format '{NAME}' has no metadata columns ({', '.join(metadata)}): declare envelope fields "
                "such as __source_ts_ms as ordinary columns"
            )
        return GenericDecoder(GenericConfig.from_options(options, self.require_schema(schema)))

    def create_encoder(
        self, options: Mapping[str, str], schema: Schema, key_columns: Sequence[str] = ()
    ) -> GenericEncoder:
        config = GenericConfig.from_options(options, schema)
        return GenericEncoder(config, key_columns or config.key_columns)
