"""Spec 4.5 Symmetrical usage: every example as a test (../shared/spec/000_*.txt).

Expected outputs are copied from the spec; where it contradicts itself or leaves a choice open we
follow docs/spec-notes.md and cite the note ("note N"). Rows are compared with their column order.
"""

from __future__ import annotations

from helpers import (
    assert_exact,
    dele,
    ins,
    materialize,
    ua,
)

from cdcflow import from_changelog, to_changelog

DYNAMIC_TABLE = [ins(id=1, name="Alice"), ua(id=1, name="Alice Updated"), dele(id=1, name="Alice Updated")]
APPEND_STREAM = [
    {"op": "INSERT", "id": 1, "name": "Alice"},
    {"op": "UPDATE_AFTER", "id": 1, "name": "Alice Updated"},
    {"op": "DELETE", "id": 1, "name": "Alice Updated"},
]


def test_4_5_1_from_changelog_of_to_changelog() -> None:
    append_stream = list(to_changelog(DYNAMIC_TABLE))
    assert_exact(append_stream, APPEND_STREAM)
    changelog = list(from_changelog(append_stream))
    assert_exact(changelog, DYNAMIC_TABLE)
    assert materialize(changelog) == []  # Table: empty after all operations
    assert_exact(list(from_changelog(to_changelog(DYNAMIC_TABLE))), DYNAMIC_TABLE)  # chained lazily


def test_4_5_2_to_changelog_of_from_changelog() -> None:
    changelog = list(from_changelog(APPEND_STREAM))
    assert_exact(changelog, DYNAMIC_TABLE)
    assert materialize(changelog) == []
    assert_exact(list(to_changelog(changelog)), APPEND_STREAM)
    assert_exact(list(to_changelog(from_changelog(APPEND_STREAM))), APPEND_STREAM)
