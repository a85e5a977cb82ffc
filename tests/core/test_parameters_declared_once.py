"""FROM_CHANGELOG / TO_CHANGELOG's parameters are declared once (core/params.py) and every entry point
takes exactly them: the engine, the DataFrame API and the SQL functions."""

from __future__ import annotations

from typing import Any

import pytest

import cdcflow
from cdcflow.core.params import (
    FROM_CHANGELOG_ARGUMENTS,
    TO_CHANGELOG_ARGUMENTS,
    plan_from_changelog,
    plan_to_changelog,
)


def test_the_declared_names_are_the_spec_parameters() -> None:
    assert FROM_CHANGELOG_ARGUMENTS == (
        "op",
        "before",
        "after",
        "op_mapping",
        "invalid_op_handling",
        "partition_by",
        "order_by",
        "state_ttl",
        "consume_full_deletes",
        "passthrough",
        "uid",
    )
    assert TO_CHANGELOG_ARGUMENTS == (
        "op",
        "before",
        "after",
        "op_mapping",
        "partition_by",
        "on_time",
        "state_ttl",
        "produces_full_deletes",
        "passthrough",
        "uid",
    )


def test_defaults_live_in_the_plan() -> None:
    planned = plan_from_changelog()
    assert (planned.op, planned.before, planned.after, planned.partition_by) == ("op", None, None, ())
    assert planned.invalid_op_handling.name == "FAIL" and planned.consume_full_deletes is False
    to = plan_to_changelog()
    assert (to.op, to.on_time, to.produces_full_deletes) == ("op", None, False)


@pytest.mark.parametrize(
    ("function", "misspelt"),
    [
        (cdcflow.from_changelog, "partition"),
        (cdcflow.to_changelog, "invalid_op_handling"),  # a FROM_CHANGELOG parameter only
        (plan_from_changelog, "on_time"),
        (plan_to_changelog, "order_by"),
    ],
)
def test_an_unknown_keyword_is_pythons_type_error(function: Any, misspelt: str) -> None:
    name = function.__name__.removeprefix("plan_")
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument '{misspelt}'$"):
        function([], **{misspelt: "x"}) if not function.__name__.startswith("plan_") else function(
            **{misspelt: "x"}
        )


def test_the_engine_runs_with_the_declared_keywords() -> None:
    rows = [{"op": "c", "id": 1}, {"op": "d", "id": 1}]
    changes = cdcflow.from_changelog(rows, op_mapping={"c": "INSERT", "d": "DELETE"})
    assert [str(c) for c in changes] == ["+I[1]", "-D[1]"]
