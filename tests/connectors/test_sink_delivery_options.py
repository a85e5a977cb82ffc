"""The sink's delivery options are checked on the driver, each error naming the fix."""

from __future__ import annotations

import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.options import DeliveryGuarantee
from cdcflow.connectors.spark.sink import plan_write
from cdcflow.connectors.spark.sink_transactions import TaskIdentity, producer_defaults

SCHEMA = StructType(
    [
        StructField("id", IntegerType(), False),
        StructField("name", StringType()),
        StructField("_row_kind", StringType()),
    ]
)
BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "out", "keyColumns": "id"}


def planned(**options: str) -> object:
    return plan_write("debezium-json", {**BASE, **options}, SCHEMA)


def refused(**options: str) -> str:
    with pytest.raises(ConnectorOptionError) as error:
        planned(**options)
    return str(error.value)


def test_default_is_at_least_once_with_an_idempotent_producer() -> None:
    plan = plan_write("debezium-json", BASE, SCHEMA)
    assert plan.delivery is DeliveryGuarantee.AT_LEAST_ONCE and plan.transactional_id_prefix is None
    assert producer_defaults(plan.delivery) == {"enable.idempotence": True, "acks": "all"}


def test_exactly_once_with_a_prefix_is_planned() -> None:
    plan = plan_write(
        "debezium-json",
        {**BASE, "SINK.DELIVERY-GUARANTEE": "exactly-once", "sink.transactional-id-prefix": "orders"},
        SCHEMA,
    )
    assert plan.delivery is DeliveryGuarantee.EXACTLY_ONCE and plan.transactional_id_prefix == "orders"
    identity = TaskIdentity("query-1", 7, 3)
    assert identity.transactional_id("orders") == "orders-3"
    assert identity.transactional_id(None) == "cdcflow-query-1-3"
    settings = producer_defaults(plan.delivery, identity.transactional_id("orders"))
    assert settings["transactional.id"] == "orders-3" and settings["acks"] == "all"


def test_none_drops_idempotence() -> None:
    plan = plan_write("debezium-json", {**BASE, "sink.delivery-guarantee": "none"}, SCHEMA)
    assert producer_defaults(plan.delivery) == {"enable.idempotence": False, "acks": "1"}


def test_unknown_guarantee_lists_the_valid_ones() -> None:
    message = refused(**{"sink.delivery-guarantee": "twice"})
    assert "exactly-once, at-least-once, none" in message


def test_prefix_without_exactly_once_is_refused() -> None:
    message = refused(**{"sink.transactional-id-prefix": "orders"})
    assert "sink.delivery-guarantee=exactly-once" in message


def test_empty_prefix_is_refused() -> None:
    message = refused(**{"sink.delivery-guarantee": "exactly-once", "sink.transactional-id-prefix": " "})
    assert "empty" in message


def test_a_fixed_transactional_id_is_refused() -> None:
    message = refused(**{"sink.delivery-guarantee": "exactly-once", "kafka.transactional.id": "one"})
    assert "sink.transactional-id-prefix" in message


@pytest.mark.parametrize(("setting", "value"), [("enable.idempotence", "false"), ("acks", "1")])
def test_settings_contradicting_exactly_once_are_refused(setting: str, value: str) -> None:
    message = refused(**{"sink.delivery-guarantee": "exactly-once", f"kafka.{setting}": value})
    assert f"kafka.{setting}={value}" in message and "at-least-once" in message


def test_malformed_transaction_timeout_is_refused() -> None:
    message = refused(**{"sink.delivery-guarantee": "exactly-once", "kafka.transaction.timeout.ms": "soon"})
    assert "transaction.max.timeout.ms" in message


def test_settings_compatible_with_exactly_once_are_accepted() -> None:
    planned(
        **{
            "sink.delivery-guarantee": "exactly-once",
            "kafka.acks": "-1",
            "kafka.enable.idempotence": "true",
            "kafka.transaction.timeout.ms": "60000",
        }
    )
