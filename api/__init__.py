"""cdcflow: change-data-capture changelogs (Debezium, Canal, ...) for Apache Spark.

The engine is importable on its own, with no Spark or Kafka::

    from cdcflow import from_changelog, to_changelog, RowKind, Change, Watermark
"""

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
    "to_changelog",
]
