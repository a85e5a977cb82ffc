"""Errors raised by the Spark and Kafka connectors; all derive from :class:`cdcflow.core.CdcflowError`."""

from __future__ import annotations

import json

from cdcflow.core.errors import CdcflowError


class ConnectorError(CdcflowError):
    """Root of the connector errors."""


class ConnectorOptionError(ConnectorError, ValueError):
    """A source or sink option is unknown, malformed or inconsistent; raised on the driver."""


class KafkaConnectorError(ConnectorError, RuntimeError):
    """Kafka could not be read or written: names the topic/partition/offset and what to check."""


class DataLossError(KafkaConnectorError):
    """Offsets the query expected are gone (retention, a deleted topic); see ``failOnDataLoss``."""


class ReplayFormatError(ConnectorError, ValueError):
    """A recorded topic dump is malformed: names the file and line."""


class SparkSetupError(ConnectorError, RuntimeError):
    """Spark is not set up the way a connector needs (state store provider, Python, packages)."""


class ConnectorNotSupportedError(ConnectorError, NotImplementedError):
    """A parameter combination the Spark side does not run yet; the message names what does."""


class DeltaSchemaError(ConnectorError, ValueError):
    """A changelog's columns cannot be written to its Delta table: names the column and the fix."""


class ChangelogConsistencyError(ConnectorError, ValueError):
    """A changelog breaks what the Delta sink relies on (null keys, an unpaired -U): names batch and key."""


class SinkOrderError(ConnectorError, ValueError):
    """A Kafka sink's input would lose a key's order (an update split across tasks, a key written by
    two tasks of one batch): names the key or tasks and how to partition the DataFrame."""


class CheckpointInUseError(ConnectorError, RuntimeError):
    """Another job holds the checkpoint's lease (or took it over): names its process, host and heartbeat."""


class SchemaChangedError(ConnectorError, RuntimeError):
    """A message has columns that the query's inferred columns lack (a column added upstream).

    A streaming query's columns are fixed while it runs, so the read stops before any row of the
    micro-batch is written. The message names where, the new columns and the fix, and ends with
    :data:`SCHEMA_CHANGED_MARKER` and both as JSON, for :func:`schema_change` to read back from Spark's
    error (``cdcflow ingest`` restarts by itself with the wider columns).
    """

    def __init__(self, origin: str, columns_ddl: str) -> None:
        details = json.dumps({"origin": origin, "columns": columns_ddl})
        super().__init__(
            f"{origin}: the message has columns that the columns inferred when the query started lack: "
            f"{columns_ddl}. A streaming query's columns are fixed while it runs, so it stops before "
            "writing any row of this micro-batch. `cdcflow ingest` restarts by itself with the wider "
            f"columns; restart a Spark query with .option('addedColumns', '{columns_ddl}') (added to the "
            "inferred columns), or declare every column with .option('columns', '<DDL>'). "
            f"{SCHEMA_CHANGED_MARKER}{details}"
        )
        self.origin = origin
        self.columns_ddl = columns_ddl


SCHEMA_CHANGED_MARKER = "[cdcflow:schema-changed] "


def schema_change(error_text: str) -> tuple[str, str] | None:
    """Where and which new columns (DDL) a :class:`SchemaChangedError` in ``error_text`` names.

    Spark wraps an executor's error (``StreamingQueryException`` around a Python traceback), so the
    details are found by their marker in the text; None when there is none.
    """
    at = error_text.find(SCHEMA_CHANGED_MARKER)
    if at < 0:
        return None
    try:
        details, _ = json.JSONDecoder().raw_decode(error_text, at + len(SCHEMA_CHANGED_MARKER))
    except ValueError:
        return None
    if not isinstance(details, dict):
        return None
    origin, columns = details.get("origin"), details.get("columns")
    return (origin, columns) if isinstance(origin, str) and isinstance(columns, str) else None
