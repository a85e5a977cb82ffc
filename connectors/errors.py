"""Errors raised by the Spark and Kafka connectors; all derive from :class:`cdcflow.core.CdcflowError`."""

from __future__ import annotations

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
