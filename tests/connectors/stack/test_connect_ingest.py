"""PostgreSQL 15 → Debezium on Kafka Connect → Kafka → ``python -m cdcflow ingest`` → Delta, for real.

Every check compares the Delta table with PostgreSQL's own SELECT. The connector config and the worker
settings are docker/connect's files, as the compose stack uses them.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from connect_worker import ConnectWorker
from deltalake import DeltaTable
from ingest_process import start_ingest, tail, wait_for, wait_session_gone
from postgres_server import DOCKER_POSTGRES, PostgresServer
from workload import COLUMNS, SCHEMA_DDL, SEED_ROWS, Workload, table_rows

TOPIC_PARTITIONS = 2  # docker/connect/debezium-postgres.json: topic.creation.default.partitions
CONVERGE_TIMEOUT_S = 180.0
CHAIN_MOVES = 3
CHAIN_RECORDS = CHAIN_MOVES * 4  # a key change: delete, tombstone, create; then an update


def connector_values(
    pg: PostgresServer, run: str, *, schemas: bool, exactly_once: bool = False
) -> dict[str, str]:
    return {
        "CONNECTOR_NAME": run,
        "POSTGRES_HOST": "127.0.0.1",
        "POSTGRES_PORT": str(pg.port),
        "POSTGRES_USER": "postgres",
        "POSTGRES_PASSWORD": "unused-trust-auth",
        "POSTGRES_DB": run,
        "TOPIC_PREFIX": run,
        "SLOT_NAME": run,
        "SCHEMAS_ENABLE": "true" if schemas else "false",
        "EXACTLY_ONCE_SUPPORT": "required" if exactly_once else "requested",
    }


def capture(pg: PostgresServer, worker: ConnectWorker, bootstrap: str, run: str, **flags: bool) -> str:
    """A database ``run`` with the sample schema, captured by a connector ``run`` into the topic
    ``run``.inventory.items; returns once the snapshot's rows are in Kafka."""
    pg.create_database(run, DOCKER_POSTGRES / "10-inventory.sql")
    worker.register(connector_values(pg, run, **flags))
    topic = f"{run}.inventory.items"
    wait_records(bootstrap, topic, SEED_ROWS)
    return topic


def end_offsets(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "stack-probe"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in sorted(partitions)
        ]
    finally:
        consumer.close()


def wait_records(bootstrap: str, topic: str, at_least: int, timeout: float = 120, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            offsets = end_offsets(bootstrap, topic)
        except (KeyError, Exception):  # noqa: BLE001 - the topic does not exist yet
            offsets = []
        if sum(offsets) >= at_least:
            return
        assert time.monotonic() < deadline, (
            f"{topic}: {sum(offsets)} records after {timeout:.0f} s, want {at_least}"
        )
        time.sleep(poll)


def ingest_args(bootstrap: str, topic: str, work: Path, *, schemas: bool, trigger: str) -> list[str]:
    # REPLICA IDENTITY DEFAULT: updates carry no before image, deletes only the key
    args = [
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--key",
        "id",
    ]  # no changelog-mode: ingest reads the DEFAULT-identity updates (no before image) as upserts
    args += ["--target", str(work / "table"), "--checkpoint", str(work / "checkpoint"), "--trigger", trigger]
    if trigger == "continuous":
        args += ["--interval", "1 second"]
    if schemas:  # the columns come from the messages' schema blocks
        args += ["--option", "schema-include=true"]
    else:
        args += ["--schema", SCHEMA_DDL, "--option", "schema-include=false"]
    return args


def delta_rows(target: Path) -> list[dict[str, Any]] | None:
    if not (target / "_delta_log").is_dir():
        return None
    table = DeltaTable(str(target)).to_pyarrow_table()
    assert sorted(table.column_names) == sorted(COLUMNS), f"Delta columns {table.column_names}"
    return sorted(table.select(list(COLUMNS)).to_pylist(), key=lambda row: row["id"])


def differences(want: list[dict[str, Any]], got: list[dict[str, Any]] | None) -> str:
    if got is None:
        return "no Delta table yet"
    mine, theirs = {r["id"]: r for r in want}, {r["id"]: r for r in got}
    missing = sorted(set(mine) - set(theirs))
    extra = sorted(set(theirs) - set(mine))
    changed = [
        (k, {c: (mine[k][c], theirs[k][c]) for c in COLUMNS if mine[k][c] != theirs[k][c]})
        for k in mine.keys() & theirs.keys()
    ]
    changed = [(k, d) for k, d in sorted(changed) if d]
    return f"missing ids {missing}, extra ids {extra}, differing (postgres, delta): {str(changed[:3])[:1500]}"


def wait_equal(
    pg: PostgresServer, db: str, target: Path, job: subprocess.Popen[bytes] | None, log: Path
) -> None:
    """Until the Delta table equals PostgreSQL's SELECT (the job, if given, must keep running)."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    while True:
        want, got = table_rows(pg, db), delta_rows(target)
        if got == want:
            return
        if job is not None and job.poll() is not None:
            pytest.fail(f"{db}: the ingest job exited with {job.returncode}:\n{tail(log, 40)}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"{db}: Delta != PostgreSQL after {CONVERGE_TIMEOUT_S:.0f} s: "
                f"{differences(want, got)}\n{tail(log)}"
            )
        time.sleep(1)


def toasted_row(pg: PostgresServer, db: str, workload: Workload) -> int:
    """A row whose ``body`` is stored out of line (any row if none is)."""
    rows = sorted(table_rows(pg, db), key=lambda row: -len(row["body"] or ""))
    assert {row["id"] for row in rows} == workload.live
    return int(rows[0]["id"])


def kill_ingest(job: subprocess.Popen[bytes]) -> None:
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    wait_session_gone(job.pid)


class Run:
    """One captured database and its ingest job."""

    def __init__(self, name: str, schemas: bool, topic: str, work: Path, bootstrap: str) -> None:
        self.name, self.schemas, self.topic, self.work = name, schemas, topic, work
        self.args = ingest_args(bootstrap, topic, work, schemas=schemas, trigger="continuous")
        work.mkdir(parents=True, exist_ok=True)
        self.starts = 0
        self.job: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.work / f"ingest-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        self.job = start_ingest(self.args, self.log)

    def kill(self) -> None:
        if self.job is not None and self.job.poll() is None:
            kill_ingest(self.job)


def run_dml(pg: PostgresServer, db: str, workload: Workload, transactions: int, pause: float = 0.02) -> None:
    for _ in range(transactions):
        pg.psql(workload.transaction(), db=db)
        time.sleep(pause)


def in_background(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - re-raised by the test
            errors.append(error)

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    return thread, errors


def test_debezium_through_connect_to_delta_with_restarts(
    postgres: PostgresServer, connect_worker: ConnectWorker, stack_bootstrap: str, tmp_path: Path
) -> None:
    """Both JsonConverter forms at once (one connector each): snapshot, then seeded DML while the ingest
    jobs are SIGKILLed and restarted and the Connect worker is killed and restarted; Delta ends equal to
    PostgreSQL, and equal at the checkpoints in between."""
    runs: list[Run] = []
    for name, schemas in (("dbz_schemas", True), ("dbz_plain", False)):
        topic = capture(postgres, connect_worker, stack_bootstrap, name, schemas=schemas)
        assert len(end_offsets(stack_bootstrap, topic)) == TOPIC_PARTITIONS
        runs.append(Run(name, schemas, topic, tmp_path / name, stack_bootstrap))
    workloads = {run.name: Workload(seed=11 if run.schemas else 12) for run in runs}
    try:
        for run in runs:
            run.start()
        for run in runs:
            assert run.job is not None
            wait_equal(postgres, run.name, run.work / "table", run.job, run.log)
            assert len(table_rows(postgres, run.name)) == SEED_ROWS

        # Phase 1: DML while the ingest jobs are killed (SIGKILL, mid-batch or not) and started again.
        threads = [
            in_background(lambda r=run: run_dml(postgres, r.name, workloads[r.name], 60)) for run in runs
        ]
        time.sleep(2)
        for run in runs:
            run.kill()
            run.start()
        for thread, errors in threads:
            thread.join()
            assert not errors, errors
        for run in runs:
            wait_equal(postgres, run.name, run.work / "table", run.job, run.log)

        # Phase 2: DML while the Connect worker is killed (no clean shutdown) and started again: Debezium
        # resumes from its last flushed offset (flushed every second) and sends what follows again. The
        # kill comes as soon as a chain of key changes of a TOASTed row is in Kafka, so that chain is
        # likely among what is sent again, after the row's key moved on.
        chained = threading.Barrier(len(runs) + 1, timeout=CONVERGE_TIMEOUT_S)
        killed = threading.Event()
        before: dict[str, int] = {}

        def dml_around_the_kill(run: Run) -> None:
            workload = workloads[run.name]
            run_dml(postgres, run.name, workload, 30)
            before[run.name] = sum(end_offsets(stack_bootstrap, run.topic))
            for sql in workload.key_chain(toasted_row(postgres, run.name, workload), CHAIN_MOVES):
                postgres.psql(f"BEGIN;\n{sql}\nCOMMIT;\n", db=run.name)
            chained.wait()
            killed.wait(CONVERGE_TIMEOUT_S)
            run_dml(postgres, run.name, workload, 30)

        threads = [in_background(functools.partial(dml_around_the_kill, run)) for run in runs]
        try:
            chained.wait()
            for run in runs:
                wait_records(stack_bootstrap, run.topic, before[run.name] + CHAIN_RECORDS, poll=0.02)
            connect_worker.restart(signal.SIGKILL)
        finally:
            killed.set()
        for run in runs:
            connect_worker.wait_running(run.name)
        for thread, errors in threads:
            thread.join()
            assert not errors, errors
        for run in runs:
            run_dml(postgres, run.name, workloads[run.name], 20)
        for run in runs:
            wait_equal(postgres, run.name, run.work / "table", run.job, run.log)
            rows = table_rows(postgres, run.name)
            assert any(row["body"] and len(row["body"]) > 2000 for row in rows), (
                "no TOASTed body left to check"
            )
            assert workloads[run.name].committed >= 100
    finally:
        for run in runs:
            run.kill()


def read_topic(bootstrap: str, topic: str, isolation: str) -> list[Any]:
    """Every record of ``topic`` a consumer with ``isolation.level=isolation`` reads, up to the ends."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"probe-{isolation}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    records: list[Any] = []
    ended: set[int] = set()
    deadline = time.monotonic() + 60
    while len(ended) < TOPIC_PARTITIONS:
        assert time.monotonic() < deadline, f"{topic}: partitions {ended} ended in 60 s"
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            ended.add(message.partition())
        else:
            records.append(message)
    consumer.close()
    return records


def key_id(message: Any) -> int:
    key = json.loads(message.key())
    return int((key["payload"] if "payload" in key else key)["id"])


def aborted_changes(bootstrap: str, topic: str, row_id: int) -> int:
    """Writes, in a transaction that is then aborted: an update of ``row_id`` (a copy of its latest event,
    name set to 'ABORTED', with a log position after every real one) and an insert of id 9999."""
    events = [m for m in read_topic(bootstrap, topic, "read_committed") if m.value() and key_id(m) == row_id]
    latest = events[-1] if events else None
    assert latest is not None, f"no event of id {row_id} in {topic}"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"aborting-{topic}"})
    producer.init_transactions(60)
    producer.begin_transaction()
    value = json.loads(latest.value())
    payload = value["payload"] if "payload" in value and "schema" in value else value
    payload["op"] = "u"
    payload["before"] = None
    payload["after"] = dict(payload["after"], name="ABORTED")
    payload["source"]["lsn"] = 2**40
    payload["source"]["sequence"] = json.dumps([str(2**40), str(2**40)])
    payload["source"]["ts_ms"] = int(time.time() * 1000) + 60_000
    producer.produce(
        topic,
        json.dumps(value).encode(),
        latest.key(),
        partition=latest.partition(),
        headers=latest.headers(),
    )
    payload["after"] = dict(payload["after"], id=9999, name="ABORTED INSERT")
    payload["op"] = "c"
    key = json.loads(latest.key())
    (key["payload"] if "payload" in key else key)["id"] = 9999
    producer.produce(topic, json.dumps(value).encode(), json.dumps(key).encode(), headers=latest.headers())
    producer.flush(30)
    producer.abort_transaction(60)
    return 2


def test_exactly_once_source_and_an_aborted_transaction_never_reach_delta(
    postgres: PostgresServer, stack_bootstrap: str, tmp_path: Path
) -> None:
    """A worker with exactly.once.source.support=enabled writes Debezium's records in transactions (the
    connector requires it); a foreign transaction on the same topic is aborted. The ingest job, with no
    isolation option (read_committed is its default), applies every committed change and none of the
    aborted ones."""
    worker = ConnectWorker(
        tmp_path / "connect-eos", stack_bootstrap, "connect-eos", exactly_once=True
    ).start()
    name = "dbz_eos"
    try:
        topic = capture(postgres, worker, stack_bootstrap, name, schemas=False, exactly_once=True)
        workload = Workload(seed=13)
        run_dml(postgres, name, workload, 40, pause=0)
        victim = min(row["id"] for row in table_rows(postgres, name))
        aborted = aborted_changes(stack_bootstrap, topic, victim)
        run_dml(postgres, name, workload, 20, pause=0)  # committed changes after the aborted ones
        postgres.psql("INSERT INTO inventory.items (id, name) VALUES (1000, 'last');", db=name)
        deadline = time.monotonic() + 120
        while not any(
            m.value() and key_id(m) == 1000 for m in read_topic(stack_bootstrap, topic, "read_committed")
        ):
            assert time.monotonic() < deadline, f"{topic}: the last insert did not arrive in 120 s"
            time.sleep(0.5)
        committed = read_topic(stack_bootstrap, topic, "read_committed")
        everything = read_topic(stack_bootstrap, topic, "read_uncommitted")
        assert len(everything) - len(committed) == aborted
        assert sum(1 for m in everything if b'"ABORTED' in (m.value() or b"")) == aborted
        # Connect wrote in transactions: its commit markers take offsets of their own
        assert sum(end_offsets(stack_bootstrap, topic)) > len(everything)

        work = tmp_path / "ingest"
        work.mkdir()
        log = work / "ingest.log"
        job = start_ingest(
            ingest_args(stack_bootstrap, topic, work, schemas=False, trigger="available-now"), log
        )
        wait_for(job, timeout=300)
        assert job.returncode == 0, tail(log, 40)
        got = delta_rows(work / "table")
        assert got is not None and not any((row["name"] or "").startswith("ABORTED") for row in got), tail(
            log
        )
        assert got == table_rows(postgres, name), differences(table_rows(postgres, name), got)
    finally:
        worker.stop()
