"""source.sequence: each Debezium connector's log position as integers that order one log's changes."""

from __future__ import annotations

from typing import Any

import pytest

from cdcflow.formats.debezium.position import source_sequence


def test_postgres_orders_by_last_commit_then_lsn() -> None:
    first = source_sequence(
        {"connector": "postgresql", "sequence": '["24023119","24023128"]', "lsn": 24023128}
    )
    later = source_sequence(
        {"connector": "postgresql", "sequence": ["24023300", "24023310"], "lsn": 24023310}
    )
    snapshot = source_sequence({"connector": "postgresql", "sequence": '[null,"24023000"]', "lsn": 24023000})
    assert first == [24023119, 24023128]
    assert later == [24023300, 24023310], "a sequence already decoded as a list is read as well"
    assert snapshot is not None and snapshot < first < later
    assert source_sequence({"connector": "postgresql", "lsn": 42}) == [42]


def test_mysql_position_is_file_number_pos_row_and_restarts_with_the_binlog() -> None:
    def mysql(file: str, pos: int, row: int = 0) -> list[int] | None:
        return source_sequence({"connector": "mysql", "file": file, "pos": pos, "row": row, "server_id": 1})

    assert mysql("mysql-bin.000042", 9000) == [42, 9000, 0]
    assert mysql("mysql-bin.000042", 9000, 1) > mysql("mysql-bin.000042", 9000)  # type: ignore[operator]
    assert mysql("mysql-bin.000043", 4) > mysql("mysql-bin.000042", 9000)  # type: ignore[operator]
    # RESET MASTER / failover: the position goes backwards; the applier's restart_by tells it from a
    # late change (docs/lakehouse.md, Ordering)
    assert mysql("mysql-bin.000001", 4000) < mysql("mysql-bin.000042", 9000)  # type: ignore[operator]


def test_sqlserver_positions_have_the_same_parts_with_or_without_a_change_lsn() -> None:
    snapshot = source_sequence({"connector": "sqlserver", "commit_lsn": "00000025:00000d98:0002"})
    change: dict[str, Any] = {
        "connector": "sqlserver",
        "commit_lsn": "00000025:00000d98:0002",
        "change_lsn": "00000025:00000d90:0003",
        "event_serial_no": 2,
    }
    streamed = source_sequence(change)
    assert snapshot == [0x25, 0xD98, 2, 0, 0, 0, 0]
    assert streamed == [0x25, 0xD98, 2, 0x25, 0xD90, 3, 2]
    assert snapshot < streamed
    assert source_sequence({**change, "commit_lsn": "NULL"}) is None


def test_oracle_orders_by_commit_scn_then_scn() -> None:
    assert source_sequence({"connector": "oracle", "scn": "2122185", "commit_scn": "2122190"}) == [
        2122190,
        2122185,
    ]
    assert source_sequence({"connector": "oracle", "scn": 7}) == [7, 7]


@pytest.mark.parametrize(
    "source",
    [{"connector": "mongodb", "ord": 1}, {"connector": "mysql", "pos": 4}, {"connector": "oracle"}],
)
def test_other_connectors_and_missing_fields_give_no_sequence(source: dict[str, Any]) -> None:
    assert source_sequence(source) is None
