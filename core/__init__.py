"""The changelog engine: row kinds, FROM_CHANGELOG and TO_CHANGELOG, free of Spark and Kafka."""

from cdcflow.core.errors import (
    CdcflowError,
    ChangelogDataError,
    ChangelogValidationError,
    InvalidOperationError,
    NullKeyError,
    NullOperationError,
    OpMappingError,
)
from cdcflow.core.from_changelog_engine import FromChangelog, from_changelog
from cdcflow.core.materialize import UpsertMaterializer, materialize
from cdcflow.core.model import Change, ChangelogMetrics, Rejected, Watermark
from cdcflow.core.params import InvalidOpHandling, plan_from_changelog, plan_to_changelog
from cdcflow.core.rowkind import ChangelogMode, RowKind
from cdcflow.core.state import InMemoryStateStore, KeyState, StateStore
from cdcflow.core.to_changelog_engine import ToChangelog, to_changelog
from cdcflow.core.versioned import Version, as_of, deduplicate_latest, versions_of

__all__ = [
    "CdcflowError",
    "Change",
    "ChangelogDataError",
    "ChangelogMetrics",
    "ChangelogMode",
    "ChangelogValidationError",
    "FromChangelog",
    "InMemoryStateStore",
    "InvalidOpHandling",
    "InvalidOperationError",
    "KeyState",
    "NullKeyError",
    "NullOperationError",
    "OpMappingError",
    "Rejected",
    "RowKind",
    "StateStore",
    "ToChangelog",
    "UpsertMaterializer",
    "Version",
    "Watermark",
    "as_of",
    "deduplicate_latest",
    "from_changelog",
    "materialize",
    "plan_from_changelog",
    "plan_to_changelog",
    "to_changelog",
    "versions_of",
]
