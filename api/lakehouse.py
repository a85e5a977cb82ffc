"""cdcflow's lakehouse: changelogs applied to Delta tables exactly once, and their versioned history.

    from cdcflow.lakehouse import IngestConfig, ingest, apply_changes, DeltaHistoryWriter

Needs the ``lakehouse`` extra (delta-rs); importing this module imports pyspark and deltalake.
:func:`history_as_of` is the DataFrame form of ``cdcflow.core.versioned.as_of`` (Python rows).
"""

from cdcflow.connectors.lakehouse.delta.batch import OnTruncate
from cdcflow.connectors.lakehouse.delta.history import DeltaHistoryWriter, HistoryResult
from cdcflow.connectors.lakehouse.delta.options import Materialize
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.lakehouse.ingest_report import IngestSummary
from cdcflow.connectors.lakehouse.sink import DeltaSink, apply_changes
from cdcflow.connectors.lakehouse.versioned_frames import as_of as history_as_of
from cdcflow.connectors.lakehouse.versioned_frames import latest_by_key, read_delta, temporal_join

__all__ = [
    "BatchApplied",
    "DeltaHistoryWriter",
    "DeltaSink",
    "HistoryResult",
    "IngestConfig",
    "IngestSummary",
    "Materialize",
    "OnTruncate",
    "apply_changes",
    "history_as_of",
    "ingest",
    "latest_by_key",
    "read_delta",
    "temporal_join",
]
