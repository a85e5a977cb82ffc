"""The ``cdc-*`` data sources: one Spark name per format, readers and writers over Kafka or files.

    spark.read.format("cdc-debezium").option("columns", "id INT NOT NULL, name STRING").load(path)
    spark.readStream.format("cdc-debezium").option("kafka.bootstrap.servers", ...).option("subscribe", t)

Spark finds them by itself through the ``pyspark_cdc_*`` modules; :func:`register` is the explicit way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlparse

from pyspark.sql.datasource import (
    CaseInsensitiveDict,
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructField, StructType

from cdcflow.formats.redact import is_secret, redact
from cdcflow.formats.registry import FormatFactory, builtin_factories

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdcflow.connectors.spark.read_plan import ReadPlan


OPTIONS_METADATA = "cdcflow.options"
"""The column metadata key holding a catalog table's options (Spark does not pass them to readers)."""


class CdcSource(DataSource):
    """A changelog source and sink for one format; subclasses name the format.

    ``CREATE TABLE t USING `cdc-debezium` OPTIONS (...)``: Spark asks :meth:`schema` with the options
    and the catalog's own keys, stores the schema, and later builds readers with the query's options
    only (``SELECT ... WITH (...)``). So a catalog table's schema carries its options in its columns'
    metadata, and readers take them from there (a query's options win). Other reads keep their
    schema as it was.
    """

    format_name: ClassVar[str]
    short_name: ClassVar[str]

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Spark's catalog names the provider; a read's own options never hold that key with our name.
        self._catalog_table = str(options.get("provider", "")).lower() == self.short_name
        self.options = table_options(options) if self._catalog_table else CaseInsensitiveDict(options)

    @classmethod
    def name(cls) -> str:
        return cls.short_name

    def schema(self) -> StructType:
        if self._catalog_table:
            _refuse_secrets(self.options)
        output = self._derived_plan().output
        if not self._catalog_table:
            return output
        stored = {OPTIONS_METADATA: json.dumps(dict(self.options), sort_keys=True)}
        return StructType(
            [StructField(f.name, f.dataType, f.nullable, {**f.metadata, **stored}) for f in output]
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        from cdcflow.connectors.spark.readers import CdcBatchReader

        return CdcBatchReader(self._table_plan(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from cdcflow.connectors.spark.readers import CdcStreamReader

        return CdcStreamReader(self._table_plan(schema))

    def _table_plan(self, schema: StructType) -> ReadPlan:
        from cdcflow.connectors.errors import ConnectorOptionError

        schema = self._with_stored_options(schema)
        try:
            return self._plan(schema)
        except ConnectorOptionError as error:
            if self.options:
                raise
            raise ConnectorOptionError(
                f"{error}. No options reached '{self.short_name}'{_COLUMN_LIST_HINT}"
            ) from None

    def _with_stored_options(self, schema: StructType) -> StructType:
        """A catalog table's schema without its stored options, which join the query's (those win)."""
        stored = next(
            (f.metadata[OPTIONS_METADATA] for f in schema.fields if OPTIONS_METADATA in f.metadata), None
        )
        if stored is None:
            return schema
        self.options = CaseInsensitiveDict({**json.loads(stored), **self.options})
        if hasattr(self, "_derived"):
            del self._derived
        return StructType(
            [
                StructField(
                    f.name,
                    f.dataType,
                    f.nullable,
                    {k: v for k, v in f.metadata.items() if k != OPTIONS_METADATA},
                )
                for f in schema.fields
            ]
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from cdcflow.connectors.spark.sink import KafkaChangelogWriter, plan_write

        return KafkaChangelogWriter(plan_write(self.format_name, self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from cdcflow.connectors.spark.sink import KafkaChangelogStreamWriter, plan_write

        return KafkaChangelogStreamWriter(plan_write(self.format_name, self.options, schema))

    def _derived_plan(self) -> ReadPlan:
        """The read without a user ``.schema(...)``: planned (and columns inferred) once per source."""
        from cdcflow.connectors.spark.read_plan import plan_read

        cached: ReadPlan | None = getattr(self, "_derived", None)
        if cached is None:
            cached = plan_read(self.format_name, self.options, None)
            self._derived = cached
        return cached

    def _plan(self, schema: StructType) -> ReadPlan:
        """Spark passes the user's ``.schema(...)``, or else what :meth:`schema` returned."""
        from cdcflow.connectors.errors import ConnectorOptionError
        from cdcflow.connectors.spark.read_plan import plan_read

        try:
            derived = self._derived_plan()
        except ConnectorOptionError:
            return plan_read(self.format_name, self.options, schema)  # a user schema is needed here
        return derived if schema == derived.output else plan_read(self.format_name, self.options, schema)


def _source_class(factory: type[FormatFactory]) -> type[CdcSource]:
    """The source of a built-in format: ``cdc-debezium-avro`` is ``DebeziumAvroSource``."""
    words = factory.spark_source.removeprefix("cdc-").split("-")
    class_name = "".join(word.capitalize() for word in words) + "Source"
    namespace = {
        "__module__": __name__,
        "__qualname__": class_name,
        "__doc__": f"``{factory.spark_source}``: the ``{factory.name}`` format.",
        "format_name": factory.name,
        "short_name": factory.spark_source,
    }
    return type(class_name, (CdcSource,), namespace)


SOURCES: tuple[type[CdcSource], ...] = tuple(_source_class(factory) for factory in builtin_factories())
# Module attributes, so that Spark pickles each class by reference (and tests import them by name).
globals().update({source.__name__: source for source in SOURCES})


def source_names() -> dict[str, str]:
    """The ``cdc-*`` source of each format name and alias: the one table ``ingest``, ``stream`` and the
    checks read."""
    names = {factory.name: factory.spark_source for factory in builtin_factories()}
    for factory in builtin_factories():
        names.update(dict.fromkeys(factory.aliases, factory.spark_source))
    return names


def source_formats() -> dict[str, str]:
    """The format of each ``cdc-*`` source (its name, not an alias)."""
    return {factory.spark_source: factory.name for factory in builtin_factories()}


def shim_module(short_name: str) -> str:
    """The top-level module Spark finds a source in: ``pyspark_cdc_debezium`` for ``cdc-debezium``."""
    return "pyspark_" + short_name.replace("-", "_")


def shim_source(module: str) -> type[CdcSource]:
    """The source a ``pyspark_cdc_*`` shim exposes as ``DefaultSource``, named by the shim's module."""
    by_module = {shim_module(source.short_name): source for source in SOURCES}
    if module not in by_module:
        raise ImportError(f"{module}: no cdc-* source is declared for it; declared: {', '.join(by_module)}")
    return by_module[module]


def table_options(options: Mapping[str, str]) -> CaseInsensitiveDict:
    """A catalog table's options as the user wrote them: Spark adds its own keys (owner, provider,
    location, comment, TBLPROPERTIES) and each option again as ``option.<key>``, and qualifies
    ``path`` (``file:/...``)."""
    prefixed = {
        k[len(_OPTION_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(_OPTION_PREFIX)
    }
    path = options.get("path")
    if path is not None:
        parsed = urlparse(path)
        prefixed["path"] = parsed.path if parsed.scheme == "file" else path
    return CaseInsensitiveDict(prefixed)


def _refuse_secrets(options: Mapping[str, str]) -> None:
    """A catalog table's options live in its schema, which every DataFrame read from it carries."""
    secret = sorted(k for k, v in options.items() if is_secret(k) or redact(str(v)) != str(v))
    if secret:
        from cdcflow.connectors.errors import ConnectorOptionError

        raise ConnectorOptionError(f"option(s) {secret} hold credentials{_CREDENTIALS_HINT}")


_OPTION_PREFIX = "option."
_CREDENTIALS_HINT = (
    ", and a cdc-* table keeps its options in its schema's column metadata, which every DataFrame read "
    "from the table carries: leave them out of CREATE TABLE and give them with each query, SELECT * "
    "FROM t WITH ('<key>'='...') or spark.readStream.option('<key>', ...).table('t'), or read with "
    "spark.read.format(...)"
)
_COLUMN_LIST_HINT = (
    ": a table created with a column list, CREATE TABLE t (...) USING `cdc-...` OPTIONS (...), does not "
    "hand its OPTIONS to a Python data source. Leave out the column list and give the columns as an "
    "option, OPTIONS (columns 'id INT, ...', ...), or give the options with the query: "
    "SELECT * FROM t WITH ('path'='...')"
)


def register(spark: SparkSession) -> None:
    """Register every ``cdc-*`` source with ``spark`` (Spark also finds them by itself), and the SQL
    table functions FROM_CHANGELOG and TO_CHANGELOG (which Spark does not)."""
    from cdcflow.connectors.spark.changelog.sql import register_functions

    for source in SOURCES:
        spark.dataSource.register(source)
    register_functions(spark)
