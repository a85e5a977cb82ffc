"""Spec 003 (versioned tables): histories from changelogs, reads as of a time, the deduplicated view."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from helpers import dele, ins, t, ua, ub
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core import (
    Change,
    ChangelogDataError,
    ChangelogMetrics,
    ChangelogValidationError,
    NullKeyError,
    Rejected,
    RowKind,
    Version,
    as_of,
    deduplicate_latest,
    versions_of,
)
from cdcflow.core.versioned import changelog_of


def product(hhmm: str, product_id: str, name: str, price: str) -> dict[str, Any]:
    return {"update_time": t(hhmm), "product_id": product_id, "product_name": name, "price": Decimal(price)}


# The spec's product-price changelog.
PRODUCTS = [
    ins(**product("00:01", "p_001", "scooter", "11.11")),
    ins(**product("00:02", "p_002", "basketball", "23.11")),
    ub(**product("12:00", "p_001", "scooter", "11.11")),
    ua(**product("12:00", "p_001", "scooter", "12.99")),
    ub(**product("12:00", "p_002", "basketball", "23.11")),
    ua(**product("12:00", "p_002", "basketball", "19.99")),
    dele(**product("18:00", "p_001", "scooter", "12.99")),
]
KEY = ["product_id"]


def test_product_history_has_one_version_per_price_with_its_validity() -> None:
    assert versions_of(PRODUCTS, KEY, "update_time") == [
        Version(("p_001",), product("00:01", "p_001", "scooter", "11.11"), t("00:01"), t("12:00")),
        Version(("p_001",), product("12:00", "p_001", "scooter", "12.99"), t("12:00"), t("18:00")),
        Version(("p_002",), product("00:02", "p_002", "basketball", "23.11"), t("00:02"), t("12:00")),
        Version(("p_002",), product("12:00", "p_002", "basketball", "19.99"), t("12:00"), None),
    ]


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        # The spec's two tables: at 10:00 and at 13:00.
        (
            "10:00",
            [product("00:01", "p_001", "scooter", "11.11"), product("00:02", "p_002", "basketball", "23.11")],
        ),
        (
            "13:00",
            [product("12:00", "p_001", "scooter", "12.99"), product("12:00", "p_002", "basketball", "19.99")],
        ),
        # valid_from is inclusive, valid_to exclusive.
        (
            "12:00",
            [product("12:00", "p_001", "scooter", "12.99"), product("12:00", "p_002", "basketball", "19.99")],
        ),
        ("00:00", []),
        ("00:01", [product("00:01", "p_001", "scooter", "11.11")]),
        # The scooter is deleted at 18:00.
        ("18:00", [product("12:00", "p_002", "basketball", "19.99")]),
        ("23:59", [product("12:00", "p_002", "basketball", "19.99")]),
    ],
)
def test_spec_products_as_of(at: str, expected: list[dict[str, Any]]) -> None:
    assert as_of(versions_of(PRODUCTS, KEY, "update_time"), t(at)) == expected


def test_arrival_order_does_not_change_the_history() -> None:
    expected = versions_of(PRODUCTS, KEY, "update_time")
    assert versions_of(reversed(PRODUCTS), KEY, "update_time") == expected
    # The 12:00 update arrives before the insert it follows, and the delete before both.
    shuffled = [PRODUCTS[i] for i in (6, 3, 1, 5, 0, 2, 4)]
    assert versions_of(shuffled, KEY, "update_time") == expected


def test_delete_then_reinsert_leaves_a_gap() -> None:
    changes = [
        ins(id=1, v="a", ts=1),
        dele(id=1, v="a", ts=5),
        ins(id=1, v="b", ts=8),
        ua(id=1, v="c", ts=9),
    ]
    versions = versions_of(changes, ["id"], "ts")
    assert [(v.row["v"], v.valid_from, v.valid_to) for v in versions] == [
        ("a", 1, 5),
        ("b", 8, 9),
        ("c", 9, None),
    ]
    assert as_of(versions, 6) == []
    assert as_of(versions, 8) == [{"id": 1, "v": "b", "ts": 8}]


def test_changes_at_the_same_time_last_wins_and_no_version_is_zero_length() -> None:
    replaced = [ins(id=1, v="a", ts=1), ua(id=1, v="b", ts=5), ua(id=1, v="c", ts=5)]
    assert [(v.row["v"], v.valid_from, v.valid_to) for v in versions_of(replaced, ["id"], "ts")] == [
        ("a", 1, 5),
        ("c", 5, None),
    ]
    deleted = [ins(id=1, v="a", ts=1), ua(id=1, v="b", ts=5), dele(id=1, v="b", ts=5)]
    assert [(v.row["v"], v.valid_from, v.valid_to) for v in versions_of(deleted, ["id"], "ts")] == [
        ("a", 1, 5)
    ]
    reinserted = [ins(id=1, v="a", ts=1), dele(id=1, v="a", ts=5), ins(id=1, v="b", ts=5)]
    assert [(v.row["v"], v.valid_from, v.valid_to) for v in versions_of(reinserted, ["id"], "ts")] == [
        ("a", 1, 5),
        ("b", 5, None),
    ]


def test_update_before_is_ignored_and_a_delete_without_a_version_changes_nothing() -> None:
    assert versions_of([ub(id=1, ts=1), dele(id=2, ts=1)], ["id"], "ts") == []
    # An update with no open version opens one (an upsert stream's first +U for a key).
    assert versions_of([ua(id=1, ts=3)], ["id"], "ts") == [Version((1,), {"id": 1, "ts": 3}, 3)]


def test_a_delete_that_closes_no_version_is_kept_as_a_tombstone_on_request() -> None:
    changes = [ins(id=1, v="a", ts=1), dele(id=1, v="a", ts=3), dele(id=1, v="x", ts=5), dele(id=2, ts=4)]
    assert versions_of(changes, ["id"], "ts") == [Version((1,), {"id": 1, "v": "a", "ts": 1}, 1, 3)]
    with_tombstones = versions_of(changes, ["id"], "ts", keep_deletes=True)
    assert with_tombstones == [
        Version((1,), {"id": 1, "v": "a", "ts": 1}, 1, 3),
        Version((1,), {"id": 1, "v": "x", "ts": 5}, 5, 5),
        Version((2,), {"id": 2, "ts": 4}, 4, 4),
    ]
    # Valid at no time, but a late insert before a tombstone ends there.
    assert all(as_of(with_tombstones, at) == [] for at in (3, 4, 5, 6))
    late = [*changelog_of(with_tombstones, "ts"), ins(id=1, v="b", ts=4)]
    assert [(v.row["v"], v.valid_from, v.valid_to) for v in versions_of(late, ["id"], "ts")] == [
        ("a", 1, 3),
        ("b", 4, 5),
    ]


def test_changelog_of_spells_updates_deletes_and_gaps() -> None:
    assert [str(c) for c in changelog_of(versions_of(PRODUCTS, KEY, "update_time"), "update_time")] == [
        "+I[00:01, p_001, scooter, 11.11]",
        "+U[12:00, p_001, scooter, 12.99]",
        "-D[18:00, p_001, scooter, 12.99]",
        "+I[00:02, p_002, basketball, 23.11]",
        "+U[12:00, p_002, basketball, 19.99]",
    ]


def test_composite_key() -> None:
    changes = [ins(a=1, b="x", ts=1), ins(a=1, b="y", ts=2), ua(a=1, b="x", ts=3)]
    assert [(v.key, v.valid_from, v.valid_to) for v in versions_of(changes, ["a", "b"], "ts")] == [
        ((1, "x"), 1, 3),
        ((1, "x"), 3, None),
        ((1, "y"), 2, None),
    ]


def test_null_key_and_null_time_fail_with_the_record_position() -> None:
    with pytest.raises(NullKeyError, match="record #1.*'id'"):
        versions_of([ins(id=1, ts=1), ins(id=None, ts=2)], ["id"], "ts")
    with pytest.raises(ChangelogDataError, match="record #0.*'ts'"):
        versions_of([ins(id=1, ts=None)], ["id"], "ts")


def test_parameters_are_checked_at_the_call() -> None:
    with pytest.raises(ChangelogValidationError, match="needs a key"):
        versions_of([], [], "ts")
    with pytest.raises(ChangelogValidationError, match="not part of the key"):
        deduplicate_latest([], ["ts"], "ts")


# The spec's currency_rates. Its deduplicated changelog shows "+U 10:45 Euro 116", a row its input table
# lacks: it is added here (the 4th row) so that input and output agree.
RATES = [
    {"update_time": t("09:00"), "currency": "Yen", "rate": 102},
    {"update_time": t("09:00"), "currency": "Euro", "rate": 114},
    {"update_time": t("09:00"), "currency": "USD", "rate": 1},
    {"update_time": t("10:45"), "currency": "Euro", "rate": 116},
    {"update_time": t("11:15"), "currency": "Euro", "rate": 119},
    {"update_time": t("11:49"), "currency": "Pounds", "rate": 108},
]


def test_spec_versioned_rates_view_in_upsert_mode() -> None:
    out = deduplicate_latest(RATES, ["currency"], "update_time", update_before=False)
    assert [str(change) for change in out] == [
        "+I[09:00, Yen, 102]",
        "+I[09:00, Euro, 114]",
        "+I[09:00, USD, 1]",
        "+U[10:45, Euro, 116]",
        "+U[11:15, Euro, 119]",
        "+I[11:49, Pounds, 108]",
    ]


def test_versioned_rates_view_retracts_the_replaced_row_and_versions_it() -> None:
    out = list(deduplicate_latest(RATES, ["currency"], "update_time"))
    assert [str(change) for change in out][3:7] == [
        "-U[09:00, Euro, 114]",
        "+U[10:45, Euro, 116]",
        "-U[10:45, Euro, 116]",
        "+U[11:15, Euro, 119]",
    ]
    versions = versions_of(out, ["currency"], "update_time")
    rates_at = {hhmm: {r["currency"]: r["rate"] for r in as_of(versions, t(hhmm))} for hhmm in RATES_AT}
    assert rates_at == RATES_AT


RATES_AT = {
    "08:59": {},
    "09:00": {"Yen": 102, "Euro": 114, "USD": 1},
    "10:45": {"Yen": 102, "Euro": 116, "USD": 1},
    "11:00": {"Yen": 102, "Euro": 116, "USD": 1},
    "11:50": {"Yen": 102, "Euro": 119, "USD": 1, "Pounds": 108},
}


def test_an_older_row_changes_nothing_and_is_counted() -> None:
    metrics = ChangelogMetrics()
    rejected: list[Rejected] = []
    rows = [
        {"currency": "Euro", "rate": 116, "ts": 10},
        {"currency": "Euro", "rate": 114, "ts": 9},
        {"currency": "Euro", "rate": 117, "ts": 10},
    ]
    out = list(deduplicate_latest(rows, ["currency"], "ts", metrics=metrics, on_reject=rejected.append))
    # A row as recent as the current one replaces it (ORDER BY time DESC keeps the last of equals).
    assert out == [
        Change(RowKind.INSERT, rows[0]),
        Change(RowKind.UPDATE_BEFORE, rows[0]),
        Change(RowKind.UPDATE_AFTER, rows[2]),
    ]
    assert (metrics.records_in, metrics.changes_out, metrics.late_records) == (3, 3, 1)
    assert [(r.record, r.record_index) for r in rejected] == [(rows[1], 1)]
    assert "older than the key's latest 10" in rejected[0].reason


# Random changelogs: a key's history read at any time is the table the changes up to that time
# build, replayed in time order (an oracle that never forms intervals); and a stored history extended
# with more changes (what the Delta history writer does per batch) is the history of all of them.
_change = st.tuples(st.sampled_from(list(RowKind)), st.integers(0, 2), st.integers(0, 6), st.integers(0, 99))


def _visible(versions: list[Version]) -> tuple[list[Version], set[tuple[Any, Any]]]:
    """Real versions exactly; tombstones by position (their row is whichever delete made them)."""
    real = [v for v in versions if v.valid_to != v.valid_from]
    return real, {(v.key, v.valid_from) for v in versions if v.valid_to == v.valid_from}


@given(st.lists(_change, max_size=25), st.integers(0, 25))
def test_versions_match_a_replay_and_survive_being_stored_and_extended(
    raw: list[tuple[RowKind, int, int, int]], split: int
) -> None:
    changes = [Change(kind, {"id": key, "ts": ts, "v": v}) for kind, key, ts, v in raw]
    versions = versions_of(changes, ["id"], "ts")
    assert len({(v.key, v.valid_from) for v in versions}) == len(versions)
    assert all(v.valid_to is None or v.valid_from < v.valid_to for v in versions)
    for at in range(-1, 8):
        table: dict[int, dict[str, Any]] = {}
        for change in sorted((c for c in changes if c.row["ts"] <= at), key=lambda c: c.row["ts"]):
            if change.kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                table[change.row["id"]] = change.row
            elif change.kind is RowKind.DELETE:
                table.pop(change.row["id"], None)
        assert sorted(as_of(versions, at), key=lambda r: r["id"]) == sorted(
            table.values(), key=lambda r: r["id"]
        )
    stored = versions_of(changes[:split], ["id"], "ts", keep_deletes=True)
    extended = versions_of([*changelog_of(stored, "ts"), *changes[split:]], ["id"], "ts", keep_deletes=True)
    everything = versions_of(changes, ["id"], "ts", keep_deletes=True)
    assert _visible(sorted(extended, key=_order)) == _visible(sorted(everything, key=_order))
    assert [v for v in everything if v.valid_to != v.valid_from] == versions


def _order(version: Version) -> tuple[Any, Any]:
    return version.key, version.valid_from
