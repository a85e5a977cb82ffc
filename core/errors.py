"""The exception tree: every error cdcflow raises derives from :class:`CdcflowError`.

Subclasses also inherit the built-in error they specialise, so ``except ValueError`` keeps working
for callers that do not know cdcflow.
"""

from __future__ import annotations


class CdcflowError(Exception):
    """Root of every error raised by cdcflow."""


class ChangelogValidationError(CdcflowError, ValueError):
    """A parameter of from_changelog / to_changelog is invalid (found before any row flows)."""


class OpMappingError(ChangelogValidationError):
    """An ``op_mapping`` breaks one of the rules of spec 4.3.6."""


class ChangelogDataError(CdcflowError, ValueError):
    """A record cannot be processed: NULL op or key, unknown op code, malformed image.

    ``record_index`` is the 0-based position of the record in the input stream and ``field`` the
    input field at fault, so that callers with richer coordinates (topic, partition, offset) can wrap it.
    """

    def __init__(self, message: str, *, record_index: int | None = None, field: str | None = None) -> None:
        where = []
        if record_index is not None:
            where.append(f"record #{record_index}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.reason = message
        self.record_index = record_index
        self.field = field


class NullOperationError(ChangelogDataError):
    """The operation column is NULL (spec 4.3.5)."""


class NullKeyError(ChangelogDataError):
    """A ``partition_by`` (upsert key) column is NULL (spec 4.3.5)."""


class InvalidOperationError(ChangelogDataError):
    """An operation code is not in ``op_mapping`` and ``invalid_op_handling`` is FAIL (spec 4.3.1)."""
