"""A whole PostgreSQL database → Debezium on Kafka Connect → Kafka → one ``python -m cdcflow ingest
--topic-pattern`` job → a Delta table per table, while the database changes its tables and the job is
SIGKILLed. Every check compares a Delta table with PostgreSQL's own SELECT."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from connect_worker import ConnectWorker
from deltalake import DeltaTable
from ingest_process import start_ingest, tail
from postgres_server import DOCKER_POSTGRES, PostgresServer
from sample_database import DELTA_TYPES, SEED_ROWS, DatabaseWorkload, difference, postgres_rows
from test_connect_ingest import connector_values, in_background, kill_ingest, run_dml, wait_records
from workload import Workload

CONVERGE_TIMEOUT_S = 300.0


def wait_all_equal(
    pg: PostgresServer, db: str, lake: Path, tables: list[str], job: subprocess.Popen[bytes], log: Path
) -> None:
    """Until each table's Delta table (``lake``/table) equals PostgreSQL's; the job must keep running."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    while True:
        unequal = {table: difference(pg, db, table, lake / table) for table in tables}
        unequal = {table: why for table, why in unequal.items() if why is not None}
        if not unequal:
            return
        if job.poll() is not None:
            pytest.fail(f"the ingest job exited with {job.returncode}:\n{tail(log, 40)}")
        if time.monotonic() > deadline:
            pytest.fail(f"Delta != PostgreSQL after {CONVERGE_TIMEOUT_S:.0f} s: {unequal}\n{tail(log)}")
        time.sleep(1)


def delta_schema(target: Path) -> pa.Schema:
    return DeltaTable(str(target)).to_pyarrow_table().schema


def widened(stock: Path) -> bool:
    return pa.types.is_int64(delta_schema(stock).field("units").type)


def wait_until(condition: Callable[[], bool], job: Job) -> None:
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    while not condition():
        assert job.process is not None and job.process.poll() is None, tail(job.log, 40)
        assert time.monotonic() < deadline, tail(job.log)
        time.sleep(0.5)


class Job:
    def __init__(self, args: list[str], work: Path) -> None:
        self.args, self.work, self.starts = args, work, 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.work / f"ingest-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.process = start_ingest(self.args, self.log)

    @property
    def running(self) -> subprocess.Popen[bytes]:
        assert self.process is not None
        return self.process

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            kill_ingest(self.process)


def restart_through(job: Job, threads: list[tuple[threading.Thread, list[BaseException]]]) -> None:
    """SIGKILL the job and start it again while ``threads`` change the database; wait for them."""
    job.kill()
    job.start()
    for thread, errors in threads:
        thread.join()
        assert not errors, errors


def test_one_job_lands_every_table_through_new_tables_schema_changes_and_kills(
    postgres: PostgresServer, connect_worker: ConnectWorker, stack_bootstrap: str, tmp_path: Path
) -> None:
    """docker/postgres's five tables (an int key with TOAST and REPLICA IDENTITY DEFAULT, a text key
    under FULL, a composite key with decimals, a generated key with doubles and timestamps, a widened
    count) captured by one connector, ingested by one continuous job with no key and no schema given.
    While DML runs: a SIGKILL and restart; then a table is created, one gains a column, one's int column
    becomes bigint (and holds values past 32 bits), and the job is SIGKILLed and restarted again. Every
    Delta table ends equal to its PostgreSQL table, with the new column and the wider type."""
    db = "dbz_whole"
    postgres.create_database(db, DOCKER_POSTGRES / "10-inventory.sql")
    connect_worker.register(connector_values(postgres, db, schemas=True))
    for table, rows in SEED_ROWS.items():
        wait_records(stack_bootstrap, f"{db}.inventory.{table}", rows)
    lake, work = tmp_path / "lake", tmp_path / "work"
    work.mkdir()
    job = Job(
        [
            "--bootstrap-servers",
            stack_bootstrap,
            "--topic-pattern",
            rf"{db}\.inventory\..*",
            "--target",
            str(lake / "{table}"),
            "--checkpoint",
            str(work / "checkpoint"),
            "--trigger",
            "continuous",
            "--interval",
            "1 second",
            "--option",
            "schema-include=true",
        ],
        work,
    )
    items, others = Workload(seed=21), DatabaseWorkload(seed=22)
    tables = list(SEED_ROWS)
    try:
        job.start()
        wait_all_equal(postgres, db, lake, tables, job.running, job.log)

        # DML on every table while the job is SIGKILLed and started again
        threads = [
            in_background(lambda: run_dml(postgres, db, items, 40)),
            in_background(lambda: run_dml(postgres, db, others, 60)),
        ]
        time.sleep(3)
        restart_through(job, threads)
        wait_all_equal(postgres, db, lake, tables, job.running, job.log)

        # While the job runs: a new table, picked up by it; then a new column and a widened one, landed by
        # it; then, with DML going on, the second SIGKILL
        created, picked = threading.Event(), threading.Event()

        def evolve() -> None:
            run_dml(postgres, db, others, 15)
            postgres.psql(others.new_table(), db=db)
            run_dml(postgres, db, others, 10)
            created.set()
            assert picked.wait(CONVERGE_TIMEOUT_S)
            postgres.psql(others.add_column(), db=db)
            run_dml(postgres, db, others, 10)
            postgres.psql(others.widen(), db=db)
            run_dml(postgres, db, others, 60)

        threads = [in_background(evolve), in_background(lambda: run_dml(postgres, db, items, 30))]
        assert created.wait(CONVERGE_TIMEOUT_S)
        tables.append("shipments")
        wait_all_equal(postgres, db, lake, ["shipments"], job.running, job.log)
        picked.set()
        wait_until(lambda: widened(lake / "stock") and "unit" in delta_schema(lake / "readings").names, job)
        assert job.starts == 2
        restart_through(job, threads)
        wait_all_equal(postgres, db, lake, tables, job.running, job.log)

        assert sorted(p.name for p in lake.iterdir()) == sorted(tables)
        assert widened(lake / "stock")
        assert max(row["units"] for row in postgres_rows(postgres, db, "stock")) > 2**32
        assert "unit" in delta_schema(lake / "readings").names
        for table, columns in DELTA_TYPES.items():
            schema = delta_schema(lake / table)
            assert {c: schema.field(c).type for c in columns} == columns, table
        assert items.committed >= 60
    finally:
        job.kill()
