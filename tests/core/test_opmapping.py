"""op_mapping parsing and the planning-time rules of spec 4.3.6, in both directions."""

from __future__ import annotations

import pytest

from cdcflow.core import OpMappingError, RowKind
from cdcflow.core.opmapping import parse_from_op_mapping, parse_to_op_mapping

INSERT, UB, UA, DELETE = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE


def test_from_mapping_splits_comma_lists_on_both_sides() -> None:
    mapping = parse_from_op_mapping({"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"})
    assert mapping.groups == {
        "c": frozenset({INSERT}),
        "r": frozenset({INSERT}),
        "d": frozenset({DELETE}),
        "u": frozenset({UB, UA}),
    }
    assert mapping.output_kinds == frozenset(RowKind)
    assert not mapping.is_default


def test_from_mapping_array_form_as_dict_and_as_pairs() -> None:
    as_dict = parse_from_op_mapping({("c", "r"): ["INSERT"], ("u",): ["UPDATE_BEFORE", "UPDATE_AFTER"]})
    as_pairs = parse_from_op_mapping([(["c", "r"], ["INSERT"]), (["u"], ["UPDATE_BEFORE", "UPDATE_AFTER"])])
    assert (
        as_dict.groups
        == as_pairs.groups
        == {
            "c": frozenset({INSERT}),
            "r": frozenset({INSERT}),
            "u": frozenset({UB, UA}),
        }
    )


def test_default_mappings_are_the_row_kind_names_both_ways() -> None:
    from_default = parse_from_op_mapping(None)
    to_default = parse_to_op_mapping(None)
    assert from_default.is_default and to_default.is_default
    assert {code: set(kinds) for code, kinds in from_default.groups.items()} == {
        "INSERT": {INSERT},
        "UPDATE_BEFORE": {UB},
        "UPDATE_AFTER": {UA},
        "DELETE": {DELETE},
    }
    assert dict(to_default.codes) == {
        INSERT: "INSERT",
        UB: "UPDATE_BEFORE",
        UA: "UPDATE_AFTER",
        DELETE: "DELETE",
    }


def test_to_mapping_many_kinds_to_one_code_and_combined_updates() -> None:
    upsert = parse_to_op_mapping({"INSERT, UPDATE_AFTER": "upsert", "DELETE": "delete"})
    assert dict(upsert.codes) == {INSERT: "upsert", UA: "upsert", DELETE: "delete"}
    assert not upsert.combines_updates
    debezium = parse_to_op_mapping({("UPDATE_BEFORE", "UPDATE_AFTER"): ["u"], "INSERT": "c"})
    assert debezium.combines_updates
    assert debezium.code_for(UB) == debezium.code_for(UA) == "u"
    assert debezium.code_for(DELETE) is None


@pytest.mark.parametrize(
    "grouping",
    [
        "INSERT",
        "DELETE",
        "UPDATE_BEFORE",
        "UPDATE_AFTER",
        "UPDATE_BEFORE, UPDATE_AFTER",
        "INSERT, UPDATE_AFTER",
        "INSERT, UPDATE_BEFORE, UPDATE_AFTER",
        "UPDATE_AFTER, INSERT",
    ],
)
def test_valid_groupings_are_accepted_in_both_directions(grouping: str) -> None:
    parse_from_op_mapping({"x": grouping})
    parse_to_op_mapping({grouping: "x"})


@pytest.mark.parametrize(
    "grouping",
    [
        "INSERT, DELETE",
        "UPDATE_BEFORE, DELETE",
        "INSERT, UPDATE_BEFORE",
        "UPDATE_AFTER, DELETE",
        "INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE",
        "UPDATE_BEFORE, UPDATE_AFTER, DELETE",
    ],
)
def test_incompatible_groupings_are_rejected_naming_the_rule(grouping: str) -> None:
    with pytest.raises(OpMappingError, match="rule: a group is a single row kind"):
        parse_from_op_mapping({"x": grouping})
    with pytest.raises(OpMappingError, match="rule: a group is a single row kind"):
        parse_to_op_mapping({grouping: "x"})


def test_neither_side_a_row_kind_fails_naming_the_side_that_must_hold_kinds() -> None:
    # Spec 4.3.6: MAP['MY_INSERT', 'NEW_INSERT'] fails at planning.
    with pytest.raises(
        OpMappingError, match=r"value 'NEW_INSERT' is not a row kind name.*rule: all row kind"
    ):
        parse_from_op_mapping({"MY_INSERT": "NEW_INSERT"})
    with pytest.raises(OpMappingError, match=r"key 'MY_INSERT' is not a row kind name.*rule: all row kind"):
        parse_to_op_mapping({"MY_INSERT": "NEW_INSERT"})


def test_lower_case_kind_names_are_rejected_with_a_hint() -> None:
    with pytest.raises(OpMappingError, match="did you mean 'INSERT'"):
        parse_from_op_mapping({"c": "insert"})


def test_each_row_kind_at_most_once_across_entries() -> None:
    with pytest.raises(OpMappingError, match="rule: each row kind at most once"):
        parse_from_op_mapping({"c": "INSERT", "r": "INSERT"})
    with pytest.raises(OpMappingError, match="rule: each row kind at most once"):
        parse_from_op_mapping({"u": "UPDATE_BEFORE, UPDATE_AFTER", "a": "UPDATE_AFTER"})
    with pytest.raises(OpMappingError, match="rule: each row kind at most once"):
        parse_to_op_mapping({"INSERT, UPDATE_AFTER": "upsert", "UPDATE_AFTER": "u"})
    with pytest.raises(OpMappingError, match="rule: each row kind at most once"):
        parse_from_op_mapping({"x": "INSERT, INSERT"})


def test_a_code_maps_to_one_group_only() -> None:
    with pytest.raises(OpMappingError, match="code 'c' twice"):
        parse_from_op_mapping([("c", "INSERT"), ("c", "DELETE")])


def test_to_mapping_cannot_smuggle_a_grouping_through_one_code() -> None:
    with pytest.raises(OpMappingError, match="writes the code 'x' for both"):
        parse_to_op_mapping({"INSERT": "x", "DELETE": "x"})


def test_to_mapping_needs_exactly_one_output_code() -> None:
    with pytest.raises(OpMappingError, match="exactly one output code"):
        parse_to_op_mapping({"INSERT": "c, r"})


@pytest.mark.parametrize("bad", [{}, {"c, ": "INSERT"}, {"": "INSERT"}, {"c": 1}, "INSERT", 5, [("c",)]])
def test_malformed_mappings_are_rejected(bad: object) -> None:
    with pytest.raises(OpMappingError):
        parse_from_op_mapping(bad)  # type: ignore[arg-type]
