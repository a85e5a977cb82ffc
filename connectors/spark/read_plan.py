"""Everything a read needs, decided once on the driver: the decoder, the output columns, the input.

The plan is a frozen, picklable value: Spark ships it to the executors, which build nothing but
clients from it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from pyspark.sql import types as st

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import options as kafka_options
from cdcflow.connectors.replay import dumps as replay
from cdcflow.connectors.spark import inferred_columns
from cdcflow.connectors.spark.arrow_types import schema_of_struct, struct_type
from cdcflow.connectors.spark.metadata import CONNECTOR_METADATA, marked
from cdcflow.connectors.spark.options import (
    CONTROL_COLUMN,
    ControlEvents,
    SplitOptions,
    include_headers,
    split_options,
)
from cdcflow.formats.base import DecodeOutput, Decoder, Message
from cdcflow.formats.errors import FormatOptionError, SchemaError
from cdcflow.formats.redact import redact
from cdcflow.formats.registry import FormatFactory, resolve_format
from cdcflow.formats.source_tables import SourceTable
from cdcflow.formats.types import STRING, DataType, Field, Schema, TypeKind, parse_ddl

INFERENCE_SAMPLE = 100


@dataclass(frozen=True)
class ReplayInput:
    path: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class KafkaInput:
    options: kafka_options.KafkaOptions


@dataclass(frozen=True)
class FrameInput:
    """A DataFrame of Kafka records (:func:`~cdcflow.connectors.spark.kafka_frames.decode_kafka`): Spark's
    Kafka source reads; ``sample`` holds its first records, to infer the columns from (empty: none)."""

    sample: tuple[Message, ...] = ()


@dataclass(frozen=True)
class DeadLetterTarget:
    path: str | None
    topic: str | None
    kafka: kafka_options.KafkaOptions | None


@dataclass(frozen=True)
class ReadPlan:
    format_name: str
    decoder: Decoder
    decoded_columns: Schema
    connector_metadata: tuple[str, ...]
    row_kind_column: str
    control_column: str | None
    """``controlEvents=emit``: the column of each control event row's kind; None: they are skipped."""
    output: st.StructType
    input: ReplayInput | KafkaInput | FrameInput
    dead_letters: DeadLetterTarget | None
    include_headers: bool
    max_offsets_per_trigger: int
    max_bytes_per_trigger: int
    max_records_per_partition: int
    min_partitions: int = 0
    """``minPartitions``: a recorded file's micro-batch is split into at least this many ranges."""
    accounting_path: str | None = None
    """Where each input range's message counts go (``accountingPath``), or None."""
    handoff_path: str | None = None
    """``handoffPath``: where each input range's decoded rows go (:mod:`cdcflow.connectors.spark.handoff`);
    ``output`` is then the handoff rows' schema and ``changelog`` the decoded rows'."""
    changelog: st.StructType | None = None
    inferred_columns: Schema | None = None
    """The columns inferred from the first messages, without ``addedColumns`` (None: declared); the
    query's own planning takes them as option ``inferredColumns`` instead of sampling again."""
    primary_key: tuple[str, ...] | None = None
    """The primary-key columns the first messages name (:meth:`FormatFactory.primary_key`), when the
    plan was asked for them (``plan_read(..., primary_key=True)``); None when none names one."""
    source_tables: tuple[SourceTable, ...] = ()
    """The source tables the first messages name (:meth:`FormatFactory.source_table`), in order, when
    the plan was asked for them (``plan_read(..., tables=True)``)."""
    sampled_topic: str | None = None
    """The topic of the first message sampled (a dump's recorded topic), when asked for the tables."""
    sampled: int = 0
    """How many messages the sample holds, when asked for the tables (0: the input is empty)."""


def plan_read(
    format_name: str,
    raw: Mapping[str, str],
    user_schema: st.StructType | None,
    *,
    frame: FrameInput | None = None,
    primary_key: bool = False,
    tables: bool = False,
    first_messages: Sequence[Message] | None = None,
) -> ReadPlan:
    """The read of ``raw``'s input, or (``frame``) the decoding of a DataFrame's Kafka records; with
    ``primary_key``, also the key its first messages name (one sample serves that and the inference),
    with ``tables`` the source tables they name; ``first_messages``: the messages to take these from
    instead of the input's first (one table's of a topic many share)."""
    factory = resolve_format(format_name)
    options = split_options(raw, factory)
    row_kind = options.get("rowKindColumn")
    control = CONTROL_COLUMN if options.get("controlEvents") is ControlEvents.EMIT else None
    connector_metadata, format_metadata = _metadata(options, factory)
    headers = include_headers(options.kafka) or "headers" in connector_metadata
    if headers and "headers" not in connector_metadata:
        connector_metadata = (*connector_metadata, "headers")  # Spark's includeHeaders adds the column
    source = _input(options) if frame is None else frame
    dead_letters = _dead_letters(options, factory)
    format_options = dict(options.format)
    if dead_letters is not None:
        format_options[f"{factory.name}.ignore-parse-errors"] = "true"
    columns = _declared_columns(
        options, user_schema, (row_kind, control), connector_metadata, format_metadata
    )
    sample = _Sample(source, first_messages)
    decoder, inferred = _decoder(factory, format_options, columns, format_metadata, sample, options)
    decoded: Schema = decoder.schema
    output = struct_type(decoded)
    for key in connector_metadata:
        if key in decoded:
            raise ConnectorOptionError(
                f"metadata column '{key}' clashes with a table column of the same name: rename the column"
            )
        output.add(st.StructField(key, CONNECTOR_METADATA[key], True))
    if row_kind in decoded or row_kind in connector_metadata:
        raise ConnectorOptionError(
            f"the row kind column '{row_kind}' clashes with a column: set rowKindColumn to another name"
        )
    if control is None:
        output.add(st.StructField(row_kind, st.StringType(), False))
    else:
        if control in decoded or control in connector_metadata or control == row_kind:
            raise ConnectorOptionError(
                f"column '{control}' of controlEvents=emit clashes with a column: rename that column"
            )
        # A control event's row has no row kind and no data: every column may be null.
        output = st.StructType([st.StructField(f.name, f.dataType, True, f.metadata) for f in output.fields])
        output.add(st.StructField(row_kind, st.StringType(), True))
        output.add(st.StructField(control, st.StringType(), True))
    output = marked(output, (*connector_metadata, *format_metadata))
    handoff = _local_directory(options, "handoffPath")
    if user_schema is not None and not (handoff is not None and user_schema == _handoff_output(output)):
        _check_user_schema(user_schema, output)
        output = user_schema
    changelog = output
    if handoff is not None:
        output = _handoff_output(changelog)
    return ReadPlan(
        format_name=factory.name,
        decoder=decoder,
        decoded_columns=decoded,
        connector_metadata=connector_metadata,
        row_kind_column=row_kind,
        control_column=control,
        output=output,
        input=source,
        dead_letters=dead_letters,
        include_headers=headers or _reads_headers(factory, format_metadata),
        max_offsets_per_trigger=options.get("maxOffsetsPerTrigger"),
        max_bytes_per_trigger=options.get("maxBytesPerTrigger"),
        max_records_per_partition=max(1, options.get("maxRecordsPerPartition")),
        min_partitions=options.get("minPartitions"),
        accounting_path=_local_directory(options, "accountingPath"),
        handoff_path=handoff,
        changelog=changelog,
        inferred_columns=inferred,
        primary_key=_primary_key(factory, sample, format_options) if primary_key else None,
        source_tables=_source_tables(factory, sample) if tables else (),
        sampled_topic=next((m.topic for m in sample.messages()), None) if tables else None,
        sampled=len(sample.messages()) if tables else 0,
    )


def _handoff_output(changelog: st.StructType) -> st.StructType:
    from cdcflow.connectors.spark import handoff

    return st.StructType(
        [
            st.StructField(
                handoff.FILE_COLUMN, st.StringType(), False, {handoff.CHANGELOG_KEY: changelog.json()}
            ),
            st.StructField(handoff.ROWS_COLUMN, st.LongType(), False),
        ]
    )


def _metadata(options: SplitOptions, factory: FormatFactory) -> tuple[tuple[str, ...], tuple[str, ...]]:
    own = {column.key for column in factory.metadata_columns}
    connector: list[str] = []
    format_keys: list[str] = []
    for key in options.get("metadata"):
        if key in own:
            format_keys.append(key)
        elif key in CONNECTOR_METADATA:
            connector.append(key)
        else:
            raise ConnectorOptionError(
                f"unknown metadata column '{key}'; available: {', '.join(CONNECTOR_METADATA)}"
                + (f"; format '{factory.name}' adds {', '.join(sorted(own))}" if own else "")
            )
    return tuple(connector), tuple(format_keys)


def _reads_headers(factory: FormatFactory, format_metadata: tuple[str, ...]) -> bool:
    return any(c.reads_headers for c in factory.metadata_columns if c.key in format_metadata)


def _input(options: SplitOptions) -> ReplayInput | KafkaInput:
    path = options.get("path")
    has_kafka = any(key.lower() != "includeheaders" for key in options.kafka)
    if path is not None:
        # A replay may send its rejected records to a Kafka topic: the kafka.* settings are for that.
        client_only = options.get("deadLetterTopic") is not None
        inputs = [
            key
            for key in options.kafka
            if key.lower() != "includeheaders" and not (client_only and key.lower().startswith("kafka."))
        ]
        if inputs:
            raise ConnectorOptionError(
                "both 'path' (replay recorded files) and Kafka options are set: use one input, "
                f"Kafka options given: {', '.join(sorted(inputs))}"
            )
        return ReplayInput(path, tuple(replay.list_files(path)))
    if not has_kafka:
        raise ConnectorOptionError(
            "no input: set 'kafka.bootstrap.servers' and one of subscribe / subscribePattern / assign to "
            "read Kafka, or load(path) to replay recorded files"
        )
    return KafkaInput(kafka_options.KafkaOptions.parse(options.kafka))


def _local_directory(options: SplitOptions, key: str) -> str | None:
    path: str | None = options.get(key)
    if path is not None and "://" in path.removeprefix("file://"):
        raise ConnectorOptionError(
            f"{key} '{redact(path)}': each executor writes it with local file I/O, so it must be a local "
            "or mounted shared directory, not a URL"
        )
    return None if path is None else path.removeprefix("file://")


def _dead_letters(options: SplitOptions, factory: FormatFactory) -> DeadLetterTarget | None:
    path, topic = options.get("deadLetterPath"), options.get("deadLetterTopic")
    ignore = factory.options.parse(options.format).get("ignore-parse-errors", False)
    if path is None and topic is None:
        if ignore:
            raise ConnectorOptionError(
                f"'{factory.name}.ignore-parse-errors' is true but rejected records need somewhere to go: "
                "set deadLetterPath (a directory) or deadLetterTopic; cdcflow never drops records silently"
            )
        return None
    if path is not None and "://" in path:
        raise ConnectorOptionError(
            f"deadLetterPath '{redact(path)}': each executor writes it with local file I/O, so it must be a "
            "local or mounted shared directory, not a URL; or use deadLetterTopic"
        )
    kafka = None
    if topic is not None:
        bootstrap = {k: v for k, v in options.kafka.items() if k.lower().startswith("kafka.")}
        if not bootstrap:
            raise ConnectorOptionError("deadLetterTopic needs kafka.bootstrap.servers")
        kafka = kafka_options.KafkaOptions.parse({**bootstrap, "subscribe": topic})
    return DeadLetterTarget(path, topic, kafka)


def _declared_columns(
    options: SplitOptions,
    user_schema: st.StructType | None,
    not_data: tuple[str, str | None],
    connector_metadata: tuple[str, ...],
    format_metadata: tuple[str, ...],
) -> Schema | None:
    ddl = options.get("columns")
    if user_schema is not None and ddl is not None:
        raise ConnectorOptionError(
            "the table columns are given twice, with .schema(...) and option 'columns': keep one"
        )
    if ddl is not None:
        return parse_ddl(ddl)
    if user_schema is None:
        return None
    from cdcflow.formats.base import metadata_column_name

    row_kind, control = not_data
    if row_kind not in user_schema.fieldNames():
        raise ConnectorOptionError(
            f"the schema given with .schema(...) is the whole output, and it has no '{row_kind}' column "
            f"for the row kind: add `{row_kind} STRING NOT NULL` to it, or pass only the table columns "
            "with .option('columns', '<DDL>')"
        )
    not_table = {row_kind, control, *connector_metadata, *(metadata_column_name(k) for k in format_metadata)}
    table = st.StructType([f for f in user_schema.fields if f.name not in not_table])
    return schema_of_struct(table)


def _decoder(
    factory: FormatFactory,
    format_options: dict[str, str],
    columns: Schema | None,
    metadata: tuple[str, ...],
    sample: _Sample,
    options: SplitOptions,
) -> tuple[Decoder, Schema | None]:
    """The decoder, and the columns inferred from the first messages (None: declared)."""
    try:
        decoder = factory.create_decoder(format_options, columns, metadata)
    except FormatOptionError as error:
        if columns is None:
            raise ConnectorOptionError(
                f"{error}. With Spark, pass the table columns as .option('columns', 'id INT NOT NULL, ...') "
                "or as .schema(...) including the row kind column"
            ) from None
        raise
    added = options.get("addedColumns")
    if columns is not None:
        if added is not None:
            raise ConnectorOptionError(
                "option 'addedColumns' widens inferred columns, but the columns are declared: add the new "
                "columns to the declared ones instead"
            )
        return decoder, None
    handed = options.get(inferred_columns.OPTION)
    found = (
        inferred_columns.decode(handed)
        if handed is not None
        else _physical(_infer(decoder, sample), factory, metadata)
    )
    # Pin the inferred columns: every executor decodes against the same schema, and a message with
    # more columns stops the read (SchemaChangedError) instead of losing them.
    pinned = factory.create_decoder(format_options, _with_added(found, added), metadata)
    return pinned.failing_on_new_columns(), found


def _with_added(inferred: Schema, added: str | None) -> Schema:
    """The inferred columns, of the type ``addedColumns`` gives one (widened since), and after them the
    ``addedColumns`` they do not have (nullable)."""
    if added is None:
        return inferred
    try:
        extra = parse_ddl(added)
    except SchemaError as error:
        raise ConnectorOptionError(f"option 'addedColumns': {error}") from None
    types = {f.name: f.type for f in extra}
    widened = tuple(replace(f, type=types.get(f.name, f.type)) for f in inferred)
    return Schema((*widened, *(Field(f.name, f.type) for f in extra if f.name not in inferred)))


def columns_ddl(columns: Schema) -> str:
    """Columns as the DDL of ``addedColumns``: a variable-scale decimal (no Spark type keeps it exactly)
    is the STRING of its digits, as the source outputs it."""
    return Schema(tuple(Field(f.name, STRING) if _variable_scale(f.type) else f for f in columns)).ddl()


def _variable_scale(data_type: DataType) -> bool:
    return data_type.kind is TypeKind.DECIMAL and data_type.scale is None


def _physical(schema: Schema, factory: FormatFactory, metadata: tuple[str, ...]) -> Schema:
    from cdcflow.formats.base import metadata_column_name

    names = {metadata_column_name(key) for key in metadata}
    return Schema(tuple(f for f in schema if f.name not in names))


def _infer(decoder: Decoder, sample: _Sample) -> Schema:
    out = DecodeOutput()
    for message in sample.messages():
        decoder.decode(message, out)
        schema: Schema | None = getattr(decoder, "schema", None)
        if schema is not None:
            return schema
    if not sample.messages():
        raise EmptyInputError(
            f"format '{decoder.format_name}' found no message to infer the columns from: the input is "
            "empty; pass the table columns with .option('columns', '<DDL>')"
        )
    raise EmptyInputError(
        f"format '{decoder.format_name}' found no message to infer the columns from in the first "
        f"{INFERENCE_SAMPLE}: pass the table columns with .option('columns', '<DDL>')"
    )


def _primary_key(
    factory: FormatFactory, sample: _Sample, format_options: Mapping[str, str]
) -> tuple[str, ...] | None:
    """The primary key the first messages name, or None; two messages naming different keys (several
    tables in one input) are an error."""
    found: tuple[str, ...] | None = None
    for message in sample.messages():
        named = factory.primary_key(message.key, message.value, format_options)
        if named is None or named == found:
            continue
        if found is not None:
            raise ConnectorOptionError(
                f"the messages name two primary keys, ({', '.join(found)}) and ({', '.join(named)}) at "
                f"{message.origin()}: the input holds several tables; name the key with --key, or read one "
                "table's topic"
            )
        found = named
    return found


def _source_tables(factory: FormatFactory, sample: _Sample) -> tuple[SourceTable, ...]:
    named = (factory.source_table(message.value) for message in sample.messages())
    return tuple(dict.fromkeys(table for table in named if table is not None))


class EmptyInputError(ConnectorOptionError):
    """The columns were to be inferred and the first messages carry none: the input holds no message
    yet, or only tombstones and events without rows (DDL)."""


class _Sample:
    """The first :data:`INFERENCE_SAMPLE` messages of the input, read once, when first asked for."""

    def __init__(
        self, source: ReplayInput | KafkaInput | FrameInput, given: Sequence[Message] | None = None
    ) -> None:
        self.source = source
        self._messages: list[Message] | None = None if given is None else list(given)

    def messages(self) -> list[Message]:
        if self._messages is None:
            self._messages = list(itertools.islice(_sample(self.source), INFERENCE_SAMPLE))
        return self._messages


def _sample(source: ReplayInput | KafkaInput | FrameInput) -> Iterator[Message]:
    if isinstance(source, FrameInput):
        yield from source.sample
        return
    if isinstance(source, ReplayInput):
        for path in source.files:
            yield from replay.read_messages(path)
        return
    yield from kafka_admin.sample_messages(source.options, INFERENCE_SAMPLE)


def _check_user_schema(user: st.StructType, derived: st.StructType) -> None:
    if sorted(f.name for f in user.fields) != sorted(f.name for f in derived.fields):
        raise ConnectorOptionError(
            f"the schema given with .schema(...) has columns {user.fieldNames()}, but the source produces "
            f"{derived.fieldNames()}: add or remove columns (metadata columns come from option 'metadata')"
        )
