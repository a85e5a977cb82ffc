"""Row kinds and changelog modes (spec 2.1)."""

from __future__ import annotations

import pytest

from cdcflow import RowKind
from cdcflow.core import ChangelogMode, ChangelogValidationError, plan_from_changelog


def test_short_strings_and_names_parse_both_ways() -> None:
    assert [k.short_string for k in RowKind] == ["+I", "-U", "+U", "-D"]
    for kind in RowKind:
        assert RowKind.from_short_string(kind.short_string) is kind
        assert RowKind.from_name(kind.name) is kind
    assert [k for k in RowKind if k.is_retraction] == [RowKind.UPDATE_BEFORE, RowKind.DELETE]


def test_bad_kinds_list_the_valid_ones() -> None:
    with pytest.raises(ChangelogValidationError, match=r"use one of \+I, -U, \+U, -D"):
        RowKind.from_short_string("+X")
    with pytest.raises(ChangelogValidationError, match="use one of INSERT, UPDATE_BEFORE"):
        RowKind.from_name("UPSERT")


def test_modes() -> None:
    append, upsert, retract = ChangelogMode.append(), ChangelogMode.upsert(), ChangelogMode.retract()
    assert append.is_insert_only and not append.is_upsert
    assert upsert.is_upsert and upsert.key_only_deletes and not upsert.contains(RowKind.UPDATE_BEFORE)
    assert not retract.is_upsert and retract.kinds == frozenset(RowKind) and not retract.key_only_deletes
    assert str(upsert) == "[+I, +U, -D] (partial deletes)"
    assert str(retract) == "[+I, -U, +U, -D]"


def test_from_changelog_declares_its_output_mode_from_mapping_and_delete_kind() -> None:
    upsert = plan_from_changelog(op_mapping={"c, r": "INSERT", "u": "UPDATE_AFTER", "d": "DELETE"})
    assert upsert.output_mode == ChangelogMode.upsert(key_only_deletes=True)
    full = plan_from_changelog(
        before="b",
        after="a",
        consume_full_deletes=True,
        op_mapping={"c": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"},
    )
    assert full.output_mode == ChangelogMode.retract()
