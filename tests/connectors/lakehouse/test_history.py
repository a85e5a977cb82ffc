"""DeltaHistoryWriter: a changelog kept as SCD2 versions in Delta, one merge per batch, exactly once."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdcflow.connectors.errors import ChangelogConsistencyError, ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.history import DeltaHistoryWriter
from cdcflow.core import Change, Version, versions_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = pa.schema(
    [
        ("_row_kind", pa.string()),
        ("update_time", pa.timestamp("us", tz="UTC")),
        ("product_id", pa.string()),
        ("product_name", pa.string()),
        ("price", pa.decimal128(32, 2)),
    ]
)


def at(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return datetime(2024, 1, 1, int(hours), int(minutes), tzinfo=UTC)


def change(kind: str, hhmm: str, product_id: str, name: str, price: str) -> Change:
    return Change.parse_kind(
        kind,
        {"update_time": at(hhmm), "product_id": product_id, "product_name": name, "price": Decimal(price)},
    )


# The spec's product-price changelog, in the spec's order.
PRODUCTS = [
    change("+I", "00:01", "p_001", "scooter", "11.11"),
    change("+I", "00:02", "p_002", "basketball", "23.11"),
    change("-U", "12:00", "p_001", "scooter", "11.11"),
    change("+U", "12:00", "p_001", "scooter", "12.99"),
    change("-U", "12:00", "p_002", "basketball", "23.11"),
    change("+U", "12:00", "p_002", "basketball", "19.99"),
    change("-D", "18:00", "p_001", "scooter", "12.99"),
]
# The same changes as three micro-batches: basketball's 12:00 update comes first, its 00:02 insert a
# batch later (late: older than the version already written), the scooter's delete last.
BATCHES = [
    [PRODUCTS[0], PRODUCTS[4], PRODUCTS[5]],
    [PRODUCTS[2], PRODUCTS[3], PRODUCTS[1]],
    [PRODUCTS[6]],
]


def batch(changes: list[Change]) -> pa.Table:
    return pa.Table.from_pylist([{"_row_kind": c.kind.value, **c.row} for c in changes], schema=SCHEMA)


def writer(
    path: Path, key: tuple[str, ...] = ("product_id",), time: str = "update_time"
) -> DeltaHistoryWriter:
    return DeltaHistoryWriter(str(path), key, time, app_id="products-history")


def stored(path: Path) -> list[dict[str, Any]]:
    rows = pa.table(DeltaTable(str(path)).scan()).to_pylist()
    return sorted(rows, key=lambda r: (r["product_id"], r["valid_from"]))


def as_rows(versions: list[Version]) -> list[dict[str, Any]]:
    rows = [{**v.row, "valid_from": v.valid_from, "valid_to": v.valid_to} for v in versions]
    return sorted(rows, key=lambda r: (r["product_id"], r["valid_from"]))


def test_spec_changelog_in_batches_with_a_late_change_is_the_history_of_all_changes(tmp_path: Path) -> None:
    history = writer(tmp_path / "products")
    results = []
    for batch_id, changes in enumerate(BATCHES):
        results.append(history.apply(batch(changes), batch_id))
        so_far = [c for b in BATCHES[: batch_id + 1] for c in b]
        assert stored(tmp_path / "products") == as_rows(versions_of(so_far, ["product_id"], "update_time"))
    assert stored(tmp_path / "products") == as_rows(versions_of(PRODUCTS, ["product_id"], "update_time"))
    assert [(r.late, r.versions_inserted, r.versions_updated, r.versions_deleted) for r in results] == [
        (0, 2, 0, 0),
        # The late insert opens basketball's first version; the scooter's first one gets its end.
        (1, 2, 1, 0),
        (0, 0, 1, 0),
    ]
    assert DeltaTable(str(tmp_path / "products")).schema().to_arrow().field("valid_to").type == pa.timestamp(
        "us", tz="UTC"
    )


def test_a_replayed_batch_is_skipped_and_each_batch_is_one_commit(tmp_path: Path) -> None:
    path = tmp_path / "products"
    for batch_id, changes in enumerate(BATCHES):
        writer(path).apply(batch(changes), batch_id)
    before = stored(path)
    for batch_id in (1, 2):
        result = writer(path).apply(batch(BATCHES[batch_id]), batch_id)
        assert result.skipped and result.table_version == 2
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version("products-history")) == (2, 2)
    assert [entry["operation"] for entry in table.history()] == ["MERGE", "MERGE", "WRITE"]
    assert stored(path) == before
    assert writer(path).applied_batch() == 2


def test_changes_at_the_time_of_a_version_replace_it_or_delete_it_in_one_merge(tmp_path: Path) -> None:
    path = tmp_path / "products"
    first = [
        change("+I", "01:00", "p_001", "scooter", "1.00"),
        change("+U", "05:00", "p_001", "scooter", "2.00"),
    ]
    again = [change("+U", "05:00", "p_001", "scooter", "3.00")]
    deleted = [change("-D", "05:00", "p_001", "scooter", "3.00")]
    history = writer(path)
    history.apply(batch(first), 0)
    replaced = history.apply(batch(again), 1)
    assert (replaced.versions_inserted, replaced.versions_updated, replaced.versions_deleted) == (0, 1, 0)
    assert [r["price"] for r in stored(path)] == [Decimal("1.00"), Decimal("3.00")]
    gone = history.apply(batch(deleted), 2)
    assert (gone.versions_inserted, gone.versions_updated, gone.versions_deleted) == (0, 0, 1)
    assert stored(path) == as_rows(versions_of([*first, *again, *deleted], ["product_id"], "update_time"))
    assert [(r["price"], r["valid_to"]) for r in stored(path)] == [(Decimal("1.00"), at("05:00"))]
    assert DeltaTable(str(path)).version() == 2


def test_a_delete_that_arrives_before_its_insert_still_ends_it(tmp_path: Path) -> None:
    path = tmp_path / "products"
    history = writer(path)
    history.apply(batch([change("-D", "18:00", "p_001", "scooter", "12.99")]), 0)
    # Kept as a tombstone: a row valid at no time.
    assert [(r["valid_from"], r["valid_to"]) for r in stored(path)] == [(at("18:00"), at("18:00"))]
    history.apply(batch([change("+I", "00:01", "p_001", "scooter", "11.11")]), 1)
    assert [(r["price"], r["valid_from"], r["valid_to"]) for r in stored(path)] == [
        (Decimal("11.11"), at("00:01"), at("18:00"))
    ]


def test_an_empty_batch_creates_the_table_and_records_its_id(tmp_path: Path) -> None:
    path = tmp_path / "products"
    history = writer(path)
    assert history.applied_batch() == -1
    assert not history.apply(batch([]), 0).skipped
    assert not history.apply(batch([PRODUCTS[2]]), 1).skipped  # a lone -U versions nothing
    assert history.apply(batch([]), 1).skipped
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version("products-history"), stored(path)) == (1, 1, [])
    assert pa.schema(table.schema().to_arrow()).names == [*SCHEMA.names[1:], "valid_from", "valid_to"]


def test_bad_batches_and_options_fail_with_the_fix(tmp_path: Path) -> None:
    history = writer(tmp_path / "products")
    with pytest.raises(ChangelogConsistencyError, match="no column 'update_time'"):
        history.apply(batch(BATCHES[0]).drop_columns(["update_time"]), 0)
    bad_kind = batch(BATCHES[0]).set_column(0, "_row_kind", pa.array(["+I", "X", "+U"]))
    with pytest.raises(ChangelogConsistencyError, match="'X' is not a row kind"):
        history.apply(bad_kind, 0)
    null_key = batch(BATCHES[0]).set_column(2, "product_id", pa.array(["p_001", None, "p_002"]))
    with pytest.raises(ChangelogConsistencyError, match="key column is NULL"):
        history.apply(null_key, 0)
    with pytest.raises(ChangelogConsistencyError, match="already has a column 'valid_from'"):
        history.apply(batch(BATCHES[0]).append_column("valid_from", pa.array([1, 2, 3])), 0)
    assert not DeltaTable.is_deltatable(str(tmp_path / "products"))
    with pytest.raises(ConnectorOptionError, match="distinct"):
        writer(tmp_path / "x", key=("update_time",))
    with pytest.raises(ConnectorOptionError, match="app_id"):
        DeltaHistoryWriter(str(tmp_path / "x"), ["product_id"], "update_time", app_id="")


def test_spark_reads_the_history_files(tmp_path: Path, spark: SparkSession) -> None:
    path = tmp_path / "products"
    for batch_id, changes in enumerate(BATCHES):
        writer(path).apply(batch(changes), batch_id)
    df = spark.read.parquet(*DeltaTable(str(path)).file_uris())
    rows = sorted((r.asDict() for r in df.collect()), key=lambda r: (r["product_id"], r["valid_from"]))
    # Spark returns timestamps as naive datetimes in the session time zone (UTC).
    expected = [
        {c: v.replace(tzinfo=None) if isinstance(v, datetime) else v for c, v in row.items()}
        for row in as_rows(versions_of(PRODUCTS, ["product_id"], "update_time"))
    ]
    assert rows == expected
    assert dict(df.dtypes)["valid_to"] == "timestamp"
