"""The ``cdc-*`` data sources: one Spark name per format, readers and writers over Kafka or files.

    spark.read.format("cdc-debezium").option("columns", "id INT NOT NULL, name STRING").load(path)
    spark.readStream.format("cdc-debezium").option("kafka.bootstrap.servers", ...).option("subscribe", t)

Spark finds them by itself through the ``pyspark_cdc_*`` modules; :func:`register` is the explicit way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdcflow.connectors.read_plan import ReadPlan


class CdcSource(DataSource):
    """A changelog source and sink for one format; subclasses name the format."""

    format_name: ClassVar[str]
    short_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.short_name

    def schema(self) -> StructType:
        return self._derived_plan().output

    def reader(self, schema: StructType) -> DataSourceReader:
        from cdcflow.connectors.readers import CdcBatchReader

        return CdcBatchReader(self._plan(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from cdcflow.connectors.readers import CdcStreamReader

        return CdcStreamReader(self._plan(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from cdcflow.connectors.sink import KafkaChangelogWriter, plan_write

        return KafkaChangelogWriter(plan_write(self.format_name, self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from cdcflow.connectors.sink import KafkaChangelogStreamWriter, plan_write

        return KafkaChangelogStreamWriter(plan_write(self.format_name, self.options, schema))

    def _derived_plan(self) -> ReadPlan:
        """The read without a user ``.schema(...)``: planned (and columns inferred) once per source."""
        from cdcflow.connectors.read_plan import plan_read

        cached: ReadPlan | None = getattr(self, "_derived", None)
        if cached is None:
            cached = plan_read(self.format_name, self.options, None)
            self._derived = cached
        return cached

    def _plan(self, schema: StructType) -> ReadPlan:
        """Spark passes the user's ``.schema(...)``, or else what :meth:`schema` returned."""
        from cdcflow.connectors.errors import ConnectorOptionError
        from cdcflow.connectors.read_plan import plan_read

        try:
            derived = self._derived_plan()
        except ConnectorOptionError:
            return plan_read(self.format_name, self.options, schema)  # a user schema is needed here
        return derived if schema == derived.output else plan_read(self.format_name, self.options, schema)


class DebeziumSource(CdcSource):
    format_name = "debezium-json"
    short_name = "cdc-debezium"


class DebeziumAvroSource(CdcSource):
    format_name = "debezium-avro-confluent"
    short_name = "cdc-debezium-avro"


class CanalSource(CdcSource):
    format_name = "canal-json"
    short_name = "cdc-canal"


class MaxwellSource(CdcSource):
    format_name = "maxwell-json"
    short_name = "cdc-maxwell"


class OggSource(CdcSource):
    format_name = "ogg-json"
    short_name = "cdc-ogg"


class GenericSource(CdcSource):
    format_name = "generic"
    short_name = "cdc-generic"


class UpsertKafkaSource(CdcSource):
    format_name = "upsert-kafka"
    short_name = "cdc-upsert-kafka"


SOURCES: tuple[type[CdcSource], ...] = (
    DebeziumSource,
    DebeziumAvroSource,
    CanalSource,
    MaxwellSource,
    OggSource,
    GenericSource,
    UpsertKafkaSource,
)


def register(spark: SparkSession) -> None:
    """Register every ``cdc-*`` source with ``spark`` (Spark also finds them by itself)."""
    for source in SOURCES:
        spark.dataSource.register(source)
