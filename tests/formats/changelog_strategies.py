"""Hypothesis strategies for random retract changelogs, and the round-trip checks the format tests share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl
from cdcflow.formats.registry import FormatFactory

# --- any key order: the flat JSON formats (canal-json, maxwell-json, ogg-json) --------------------------

RT_SCHEMA = "id INT NOT NULL, name STRING, price DECIMAL(12,3), ts TIMESTAMP_NTZ(6), qty BIGINT"
names = st.none() | st.text(max_size=8)
prices = st.none() | st.decimals(
    min_value=-(10**8), max_value=10**8, places=3, allow_nan=False, allow_infinity=False
)
stamps = st.none() | st.datetimes(min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9999, 12, 31))
quantities = st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def retract_changelogs(draw: st.DrawFn) -> list[Change]:
    """Inserts, updates (-U/+U) and deletes of rows of :data:`RT_SCHEMA` on random live keys."""
    live: dict[int, dict[str, Any]] = {}
    changes: list[Change] = []
    for _ in range(draw(st.integers(0, 12))):
        values = {"name": draw(names), "price": draw(prices), "ts": draw(stamps), "qty": draw(quantities)}
        action = draw(st.sampled_from(["insert", "update", "delete"])) if live else "insert"
        if action == "insert":
            key = draw(st.integers(0, 50).filter(lambda k: k not in live))
            live[key] = {"id": key, **values}
            changes.append(Change(RowKind.INSERT, dict(live[key])))
        else:
            key = draw(st.sampled_from(sorted(live)))
            changes.append(
                Change(RowKind.UPDATE_BEFORE if action == "update" else RowKind.DELETE, dict(live[key]))
            )
            if action == "update":
                live[key] = {"id": key, **values}
                changes.append(Change(RowKind.UPDATE_AFTER, dict(live[key])))
            else:
                del live[key]
    return changes


def assert_round_trips(factory: FormatFactory, changes: list[Change]) -> None:
    """Keyed by ``id``, one message per change (an update is one), and decode(encode(x)) == x exactly."""
    schema = parse_ddl(RT_SCHEMA)
    encoded = factory.create_encoder({}, schema, ("id",)).encode_all(changes)
    assert len(encoded) == sum(c.kind is not RowKind.UPDATE_BEFORE for c in changes)
    decoder = factory.create_decoder({}, schema)
    back = decoder.decode_all([Message(x.value, key=x.key) for x in encoded]).changes
    assert back == changes


# --- per key, in order: the Debezium formats ------------------------------------------------------------

_naive = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
#: Column strategies the Debezium round trips share; each adds the columns of its own schema.
DEBEZIUM_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "name": st.text(max_size=8),
    "price": st.decimals(min_value=-(10**8), max_value=10**8, places=3, allow_nan=False),
    "at": _naive,
    "seen": _naive.map(lambda d: d.replace(tzinfo=dt.UTC)),
    "day": st.dates(min_value=dt.date(1, 1, 1)),
    "clock": st.times(),
    "raw": st.binary(max_size=6),
    "ok": st.booleans(),
    "tags": st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=3),
}


@st.composite
def rows(draw: st.DrawFn, row_id: int, values: Mapping[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A row with id ``row_id`` and, for each column of ``values``, NULL or a value of its strategy."""
    return {"id": row_id, **{name: draw(st.one_of(st.none(), s)) for name, s in values.items()}}


@st.composite
def per_key_changelogs(draw: st.DrawFn, values: Mapping[str, st.SearchStrategy[Any]]) -> list[Change]:
    """Per key: +I, then -U/+U pairs, maybe -D; keys interleaved but each key's changes in order."""
    changes: list[Change] = []
    for row_id in range(draw(st.integers(1, 4))):
        current = draw(rows(row_id, values))
        changes.append(Change(RowKind.INSERT, current))
        for _ in range(draw(st.integers(0, 2))):
            updated = draw(rows(row_id, values))
            changes += [Change(RowKind.UPDATE_BEFORE, current), Change(RowKind.UPDATE_AFTER, updated)]
            current = updated
        if draw(st.booleans()):
            changes.append(Change(RowKind.DELETE, current))
    return changes


def normalised(changes: list[Change]) -> list[tuple[RowKind, dict[str, Any]]]:
    """Decimals compare by value (1.500 == 1.5): they keep their declared scale on the way back."""
    return [
        (c.kind, {k: (v.normalize() if isinstance(v, Decimal) else v) for k, v in c.row.items()})
        for c in changes
    ]
