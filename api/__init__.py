"""cdcflow: change-data-capture changelogs (Debezium, Canal, ...) for Apache Spark.

The engine is importable on its own, with no Spark or Kafka::

    from cdcflow import from_changelog, to_changelog, RowKind, Change, Watermark
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.core import (
    CdcflowError,
    Change,
    ChangelogDataError,
    ChangelogMetrics,
    ChangelogMode,
    ChangelogValidationError,
    FromChangelog,
    InvalidOperationError,
    NullKeyError,
    NullOperationError,
    OpMappingError,
    Rejected,
    RowKind,
    ToChangelog,
    Watermark,
    from_changelog,
    to_changelog,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the ``cdc-*`` Spark data sources and the SQL table functions FROM_CHANGELOG and
    TO_CHANGELOG with ``spark``.

    Spark also finds the sources by itself (the installed ``pyspark_cdc_*`` modules), provided its workers
    run a Python where cdcflow is installed: the one ``PYSPARK_PYTHON`` names.
    """
    from cdcflow.connectors.spark.sources import register as register_sources

    register_sources(spark)


__all__ = [
    "CdcflowError",
    "Change",
    "ChangelogDataError",
    "ChangelogMetrics",
    "ChangelogMode",
    "ChangelogValidationError",
    "FromChangelog",
    "InvalidOperationError",
    "NullKeyError",
    "NullOperationError",
    "OpMappingError",
    "Rejected",
    "RowKind",
    "ToChangelog",
    "Watermark",
    "__version__",
    "from_changelog",
    "register",
    "to_changelog",
]
