"""Versioned tables on the Spark side: as_of, the event-time temporal join (batch and stream), dedup views."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.history import DeltaHistoryWriter
from cdcflow.connectors.lakehouse.versioned_frames import as_of, latest_by_key, read_delta, temporal_join
from cdcflow.core import deduplicate_latest

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def at(hhmm: str) -> datetime:
    """A naive UTC time: what Spark returns under the test session's UTC time zone."""
    hours, minutes = hhmm.split(":")
    return datetime(2024, 1, 1, int(hours), int(minutes))


# The spec's currency_rates, with the 10:45 Euro row its deduplicated changelog shows but its input lacks.
RATES = [
    ("09:00", "Yen", 102),
    ("09:00", "Euro", 114),
    ("09:00", "USD", 1),
    ("10:45", "Euro", 116),
    ("11:15", "Euro", 119),
    ("11:49", "Pounds", 108),
]
RATES_DDL = "update_time TIMESTAMP, currency STRING, rate INT"
ORDERS_DDL = "order_id STRING, currency STRING, order_time TIMESTAMP"
ORDERS = [
    ("o_001", "Euro", "09:30"),
    ("o_002", "Euro", "10:45"),  # valid_from is inclusive: the 10:45 rate
    ("o_003", "Euro", "12:00"),
    ("o_004", "Pounds", "11:00"),  # before the first Pounds rate: no version
    ("o_005", "USD", "23:00"),
]
# The rate each order was placed at (None: no rate yet).
EXPECTED = {"o_001": 114, "o_002": 116, "o_003": 119, "o_004": None, "o_005": 1}


def rates(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(at(t), c, r) for t, c, r in RATES], RATES_DDL)


def rates_history(spark: SparkSession, path: Path) -> DataFrame:
    """The versioned view of the rates, kept by DeltaHistoryWriter from the dedup changelog, read back."""
    rows = rates(spark).toArrow().to_pylist()
    changes = list(deduplicate_latest(rows, ["currency"], "update_time"))
    changelog = pa.Table.from_pylist([{"_row_kind": c.kind.value, **c.row} for c in changes])
    history = DeltaHistoryWriter(str(path), ["currency"], "update_time", app_id="rates")
    history.apply(changelog.slice(0, 5), 0)
    history.apply(changelog.slice(5), 1)
    return read_delta(spark, str(path))


def rate_by_order(df: DataFrame) -> dict[str, Any]:
    rows = df.collect()
    assert len({row["order_id"] for row in rows}) == len(rows), "an order matched several versions"
    return {row["order_id"]: row["rate"] for row in rows}


def test_orders_join_the_rate_valid_at_their_time(spark: SparkSession, tmp_path: Path) -> None:
    history = rates_history(spark, tmp_path / "rates")
    orders = spark.createDataFrame([(o, c, at(t)) for o, c, t in ORDERS], ORDERS_DDL)
    joined = temporal_join(orders, history, ["currency"], "order_time")
    assert joined.columns == [*orders.columns, "update_time", "rate", "valid_from", "valid_to"]
    assert rate_by_order(joined) == {o: r for o, r in EXPECTED.items() if r is not None}
    left = temporal_join(
        orders, history.withColumnRenamed("currency", "cur"), {"currency": "cur"}, "order_time", how="left"
    )
    assert rate_by_order(left) == EXPECTED
    o_002 = left.where("order_id = 'o_002'").first()
    assert o_002 is not None and o_002["update_time"] == at("10:45")
    with pytest.raises(ConnectorOptionError, match="also fact columns"):
        temporal_join(orders, history.withColumn("order_id", history["rate"]), ["currency"], "order_time")


def test_history_as_of_a_time_and_the_latest_rows(spark: SparkSession, tmp_path: Path) -> None:
    history = rates_history(spark, tmp_path / "rates")

    def rates_at(t: str) -> dict[str, int]:
        return {row["currency"]: row["rate"] for row in as_of(history, at(t)).collect()}

    assert rates_at("08:00") == {}
    assert rates_at("10:00") == {"Yen": 102, "Euro": 114, "USD": 1}
    assert rates_at("13:00") == {"Yen": 102, "Euro": 119, "USD": 1, "Pounds": 108}
    # The deduplicated view is the latest row per key; of rows with the same time the later one wins.
    tie = spark.createDataFrame([(at("11:15"), "Euro", 120)], RATES_DDL)
    latest = latest_by_key(rates(spark).unionByName(tie).coalesce(1), ["currency"], "update_time")
    assert {r["currency"]: (r["update_time"], r["rate"]) for r in latest.collect()} == {
        "Yen": (at("09:00"), 102),
        "Euro": (at("11:15"), 120),
        "USD": (at("09:00"), 1),
        "Pounds": (at("11:49"), 108),
    }
    assert latest.columns == ["update_time", "currency", "rate"]
    empty = tmp_path / "empty"
    DeltaHistoryWriter(str(empty), ["currency"], "update_time", app_id="rates").apply(
        pa.table(
            {
                "_row_kind": pa.array([], pa.string()),
                "currency": pa.array([], pa.string()),
                "update_time": pa.array([], pa.timestamp("us", tz="UTC")),
            }
        ),
        0,
    )
    assert read_delta(spark, str(empty)).dtypes == [
        ("currency", "string"),
        ("update_time", "timestamp"),
        ("valid_from", "timestamp"),
        ("valid_to", "timestamp"),
    ]


def test_a_stream_of_orders_joins_the_history(spark: SparkSession, tmp_path: Path) -> None:
    history = rates_history(spark, tmp_path / "rates")
    source = tmp_path / "orders"
    source.mkdir()
    for part, chunk in enumerate((ORDERS[:2], ORDERS[2:])):
        lines = [
            json.dumps({"order_id": o, "currency": c, "order_time": f"2024-01-01T{t}:00Z"})
            for o, c, t in chunk
        ]
        (source / f"part-{part}.json").write_text("\n".join(lines) + "\n")
    orders = spark.readStream.schema(ORDERS_DDL).json(str(source))
    joined = temporal_join(orders, history, ["currency"], "order_time", how="left")
    query = (
        joined.writeStream.format("memory")
        .queryName("orders_with_rates")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not finish"
    assert query.exception() is None
    assert rate_by_order(spark.table("orders_with_rates")) == EXPECTED
