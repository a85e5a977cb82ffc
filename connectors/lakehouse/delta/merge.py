"""One marked merge, two SQL dialects: what a writer's merge does, described once for delta-rs
(DataFusion) and for Delta Lake on Spark.

The source carries ``_cdcflow_op`` (``U`` inserts or updates the target row of the same identity, ``D``
deletes it) and optionally an ``unavailable`` column, a ``list<string>`` naming the columns of each row
that keep the target's value. An update assigns only the columns the source has; an insert leaves the
others NULL. Target rows the source does not name may be deleted in the same commit (``Clause``s, ORed:
expired state, every row for a truncate).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

OP = "_cdcflow_op"
"""The merge source's action column: U (insert or update) or D (delete)."""


@dataclass(frozen=True)
class Before:
    """Target rows whose ``column`` holds a time before ``moment``."""

    column: str
    moment: datetime

    def iso(self) -> str:
        return self.moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class NotEqual:
    """Target rows whose integer ``column`` is not ``value``."""

    column: str
    value: int


@dataclass(frozen=True)
class Every:
    """Every target row (a truncate)."""


Clause = Before | NotEqual | Every
"""Which target rows the merge source does not name are deleted in the same commit (ORed)."""


@dataclass(frozen=True)
class Dialect:
    """How a back end's SQL writes an identifier, a string, a timestamp and array membership."""

    quote: Callable[[str], str]
    string: Callable[[str], str]
    timestamp: Callable[[str], str]
    contains: str
    """the function ``f(array, value)`` that is true when ``array`` holds ``value``"""


def _double_quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _backquoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


DATAFUSION = Dialect(_double_quoted, _sql_string, _sql_string, "array_has")
"""delta-rs: DataFusion's SQL (an ISO text compares with a timestamp column)."""
SPARK_SQL = Dialect(
    _backquoted, _spark_string, lambda iso: f"TIMESTAMP {_spark_string(iso)}", "array_contains"
)
"""Delta Lake on Spark: Spark SQL."""


@dataclass(frozen=True)
class MergeStatement:
    """A merge in one dialect: the source (``s``) joins the target (``t``) ``on`` the identity; a
    matched row is deleted when ``delete``, else updated with ``update`` when ``write``; an unmatched
    source row is inserted with ``insert`` when ``write``; unmatched target rows go when
    ``delete_unmatched``."""

    source: pa.Table
    on: str
    delete: str
    write: str
    update: Mapping[str, str]
    insert: Mapping[str, str]
    delete_unmatched: str | None


@dataclass(frozen=True)
class Merge:
    """What one batch merges into a table, whichever back end runs it: ``source`` (with
    ``_cdcflow_op``) on ``identity``, in one commit that records ``(app_id, batch_id)``."""

    source: pa.Table
    identity: Sequence[str]
    app_id: str
    batch_id: int
    delete_unmatched: Sequence[Clause] = ()
    unavailable: str | None = None
    metadata: Mapping[str, str] | None = None
    """The commit's custom metadata (delta-rs back end)."""

    def statement(self, conform: Callable[[pa.Table], pa.Table], dialect: Dialect) -> MergeStatement:
        """The merge in ``dialect``; ``conform`` shapes the data columns like the target's (adding the
        columns the target lacks)."""
        q, identity, unavailable = dialect.quote, self.identity, self.unavailable
        marks = [c for c in (OP, unavailable) if c is not None]
        present = [c for c in self.source.schema.names if c not in marks]
        data = conform(self.source.drop_columns(marks))
        for mark in marks:
            data = data.append_column(mark, self.source.column(mark))
        written = [c for c in data.schema.names if c not in marks]

        def updated(column: str) -> str:
            if unavailable is None or column in identity:
                return f"s.{q(column)}"
            kept = f"{dialect.contains}(s.{q(unavailable)}, {dialect.string(column)})"
            return f"CASE WHEN {kept} THEN t.{q(column)} ELSE s.{q(column)} END"

        return MergeStatement(
            source=data,
            on=" AND ".join(f"t.{q(c)} = s.{q(c)}" for c in identity),
            delete=f"s.{q(OP)} = 'D'",
            write=f"s.{q(OP)} = 'U'",
            update={q(c): updated(c) for c in written if c in present},
            insert={q(c): f"s.{q(c)}" for c in written},
            delete_unmatched=render_clauses(self.delete_unmatched, dialect),
        )


def render_clauses(clauses: Sequence[Clause], dialect: Dialect) -> str | None:
    """``clauses`` as one SQL condition on the target ``t`` (None for none)."""
    rendered = []
    for clause in clauses:
        if isinstance(clause, Every):
            return "TRUE"
        if isinstance(clause, Before):
            rendered.append(f"t.{dialect.quote(clause.column)} < {dialect.timestamp(clause.iso())}")
        else:
            rendered.append(f"t.{dialect.quote(clause.column)} <> {int(clause.value)}")
    return " OR ".join(rendered) or None
