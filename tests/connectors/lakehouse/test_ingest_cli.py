"""``cdcflow ingest`` in-process (``cdcflow.cli.main``) on the session's Spark: every format of the
``cdc-*`` sources, and the one line that says what a run did."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from registry_server import RegistryHandler, serving
from test_debezium_json_registry import SMALL_SCHEMA, framed, recorded

from cdcflow.cli import main
from cdcflow.connectors.replay.dumps import read_messages, write_dump
from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.formats import Message

pytestmark = pytest.mark.integration


def table_rows(target: Path) -> list[dict[str, object]]:
    return sorted(DeltaTable(str(target)).to_pyarrow_table().to_pylist(), key=lambda row: str(row["id"]))


def test_ingest_reads_the_registry_format_that_stream_offers(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keys as Kafka Connect's JsonSchemaConverter writes them: framed, their schema in the registry;
    the job takes the key column from it (no --key)."""
    topic = "cdcflow.inventory.cdc_small"
    dump = tmp_path / "cdc_small.dump.jsonl"
    bodies = recorded("cdc_small")

    def key(body: bytes) -> bytes | None:
        envelope = json.loads(body)
        row = envelope.get("after") or envelope.get("before")
        return framed(18, json.dumps({"id": row["id"]}).encode()) if row else None  # TRUNCATE: none

    write_dump(
        dump,
        [
            Message(framed(17, body), key=key(body), topic=topic, partition=0, offset=offset, timestamp_ms=0)
            for offset, body in enumerate(bodies)
        ],
    )
    handler = RegistryHandler.fresh()
    handler.schemas[17] = (SMALL_SCHEMA, "JSON")
    key_schema = {
        "type": "object",
        "title": "cdcflow.inventory.cdc_small.Key",
        "properties": {"id": {"type": "integer", "connect.index": 0, "connect.type": "int32"}},
    }
    handler.schemas[18] = (json.dumps(key_schema), "JSON")
    target = tmp_path / "table"
    with serving(handler) as port:
        code = main(
            ["ingest", "--format", "debezium-json-registry", "--path", str(dump)]
            + ["--option", f"url=http://127.0.0.1:{port}"]
            + ["--target", str(target), "--checkpoint", str(tmp_path / "checkpoint")]
        )
    err = capsys.readouterr().err
    assert code == 0, err
    assert "cdcflow ingest: primary key (id), named by the messages" in err
    assert any(request.startswith("GET /schemas/ids/18") for request in handler.requests), handler.requests
    # recorded: a snapshot row (id 1), an insert (id 2), TRUNCATE, an insert (id 99)
    assert table_rows(target) == [{"id": 99, "label": "end"}]
    assert "1 truncate(s)" in err.splitlines()[-1] and f"{len(bodies)} messages read" in err.splitlines()[-1]


def test_the_summary_says_where_dead_letters_went_and_that_a_rerun_found_nothing_new(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded_file = tmp_path / "orders.jsonl"
    recorded_file.write_text(
        '{"before": null, "after": {"id": 1}, "op": "c"}\n'
        '{"before": null, "after": {"id": "x"}, "op": "c"}\n'
        '{"before": null, "after": {"id": 2}, "op": "c"}\n'
    )
    dead = tmp_path / "dead"
    command = ["ingest", "--path", str(recorded_file), "--schema", "id INT NOT NULL", "--key", "id"]
    command += ["--sequence-by", "none", "--option", f"deadLetterPath={dead}"]
    command += ["--target", str(tmp_path / "table"), "--checkpoint", str(tmp_path / "checkpoint")]

    assert main(command) == 0
    first = capsys.readouterr().err.splitlines()
    [letter] = read_dead_letters(str(dead))
    assert letter["line"] == 2
    assert first[-1].startswith("cdcflow ingest: done: 1 batch, 2 changes"), first
    assert f"3 messages read: 2 with changes (2 rows), 1 dead letter(s) in {dead}" in first[-1], first

    assert main(command) == 0
    again = capsys.readouterr().err.splitlines()
    version = DeltaTable(str(tmp_path / "table")).version()
    assert again[-1] == (
        f"cdcflow ingest: done: nothing new since the last run (0 changes); table version {version}, 2 rows"
    ), again
    assert table_rows(tmp_path / "table") == [{"id": 1}, {"id": 2}]


def test_relative_paths_are_the_callers_after_it_changed_directory(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose JVM is already up changes directory (a notebook's ``os.chdir``; here the test's)
    and runs ingest with relative paths: Spark's offsets and commits land in the checkpoint beside the
    lease, under Python's directory, not under the JVM's, and a rerun finds the batch done."""
    jvm_directory = Path(spark._jvm.java.lang.System.getProperty("user.dir"))  # type: ignore[union-attr]
    work = tmp_path / "work"
    work.mkdir()
    (work / "orders.jsonl").write_text(
        '{"before": null, "after": {"id": 1}, "op": "c"}\n{"before": null, "after": {"id": 2}, "op": "c"}\n'
    )
    checkpoint = f"checkpoint-{tmp_path.name}"
    monkeypatch.chdir(work)
    command = ["ingest", "--path", "orders.jsonl", "--schema", "id INT NOT NULL", "--key", "id"]
    command += ["--sequence-by", "none", "--target", "table", "--checkpoint", checkpoint]
    try:
        assert main(command) == 0
        version = DeltaTable(str(work / "table")).version()
        assert main(command) == 0
    finally:
        stray = jvm_directory / checkpoint
        found = stray.exists()
        if found and stray != work / checkpoint:
            shutil.rmtree(stray)
    assert not found or jvm_directory == work, f"Spark's checkpoint went under the JVM's directory: {stray}"
    assert {p.name for p in (work / checkpoint).iterdir()} >= {"offsets", "commits", "cdcflow-lease"}
    assert table_rows(work / "table") == [{"id": 1}, {"id": 2}]
    assert DeltaTable(str(work / "table")).version() == version, "the rerun applied the batch again"


BUNDLED = Path(str(resources.files("cdcflow.examples").joinpath("postgres-debezium.dump.jsonl")))


def test_without_key_the_job_takes_the_key_the_messages_name_and_resumes(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundled recording's Kafka keys are Debezium's ``{"schema", "payload": {"id": ...}}``: the job
    applies by ``id`` in several micro-batches, and its rerun from the checkpoint applies nothing."""
    target = tmp_path / "table"
    command = ["ingest", "--path", str(BUNDLED), "--option", "schema-include=true"]
    command += ["--option", "maxBytesPerTrigger=100000"]
    command += ["--target", str(target), "--checkpoint", str(tmp_path / "checkpoint")]
    assert main(command) == 0
    err = capsys.readouterr().err
    assert "primary key (id), named by the messages" in err
    # the recording's final rows (docs/lakehouse.md's demo, test_delta_golden.py's fold of it)
    assert [row["id"] for row in table_rows(target)] == [1, 10, 20, 4]
    assert "batches: 1," not in err.splitlines()[-1], "several micro-batches"
    versions = DeltaTable(str(target)).version()
    assert main(command) == 0
    assert DeltaTable(str(target)).version() == versions


def test_without_key_messages_that_name_none_stop_the_job_saying_to_give_one(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keyless = tmp_path / "keyless.dump.jsonl"
    write_dump(keyless, [replace(m, key=None) for m in read_messages(str(BUNDLED))])
    target = tmp_path / "table"
    code = main(
        ["ingest", "--path", str(keyless), "--option", "schema-include=true"]
        + ["--target", str(target), "--checkpoint", str(tmp_path / "checkpoint")]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "names a primary key" in err and "--key id" in err and "Traceback" not in err
    assert not target.exists(), "nothing written before the key is known"


def test_messages_naming_two_keys_are_several_tables_and_stop_the_plan(tmp_path: Path) -> None:
    from cdcflow.connectors.errors import ConnectorOptionError
    from cdcflow.connectors.spark.read_plan import plan_read

    mixed = tmp_path / "mixed.dump.jsonl"
    messages = list(read_messages(str(BUNDLED)))
    write_dump(mixed, [*messages[:3], replace(messages[3], key=b'{"sku": 1}'), *messages[4:]])
    options = {"path": str(mixed), "schema-include": "true"}
    with pytest.raises(ConnectorOptionError, match=r"two primary keys, \(id\) and \(sku\) at .*mixed"):
        plan_read("debezium-json", options, None, primary_key=True)
    assert plan_read(
        "debezium-json", {**options, "path": str(BUNDLED)}, None, primary_key=True
    ).primary_key == ("id",)


POSTGRES = Path(__file__).parents[2] / "formats" / "recorded" / "postgres"


def postgres_topics() -> dict[str, list[Message]]:
    """The PostgreSQL recording's messages (real Debezium events with schema blocks) by table topic."""
    topics: dict[str, list[Message]] = {}
    for offset, line in enumerate((POSTGRES / "schemas.jsonl").read_text().splitlines()):
        record = json.loads(line)
        if record["topic"].startswith("cdcflow.inventory."):
            topics.setdefault(record["topic"], []).append(
                Message(
                    record["value"] and record["value"].encode(),
                    key=record["key"] and record["key"].encode(),
                    topic=record["topic"],
                    partition=0,
                    offset=offset,
                )
            )
    return topics


def test_a_folder_of_recorded_topics_lands_each_table_in_its_own_delta_table(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A whole database from recorded files: the PostgreSQL recording's tables (real Debezium events with
    schema blocks), one dump per topic, in one job without --key or --schema; the target's placeholders
    come from each table's ``source`` block; what --exclude-tables leaves out is said, and not read. A
    table whose 105th message is corrupt fails in its second micro-batch: isolated, the others land
    (exit 3); --progress-json has a line per applied batch of each table; --table-mode keeps one table
    as SCD2 history."""
    topics = postgres_topics()
    created = json.loads(topics["cdcflow.inventory.cdc_small"][0].value or b"")
    assert created["payload"]["op"] in ("c", "r")
    bad = []
    for i in range(120):
        created["payload"]["after"]["id"] = i
        created["payload"]["source"]["table"] = "cdc_bad"
        value = b"{not json" if i == 105 else json.dumps(created).encode()
        bad.append(Message(value, key=json.dumps({"id": i}).encode(), topic="cdc_bad", partition=0, offset=i))
    topics["cdcflow.inventory.cdc_bad"] = bad
    folder = tmp_path / "topics"
    folder.mkdir()
    for topic, messages in topics.items():
        write_dump(folder / f"{topic}.dump.jsonl", messages)
    lake, progress = tmp_path / "lake", tmp_path / "progress.jsonl"
    command = ["ingest", "--path", str(folder), "--option", "schema-include=true"]
    command += ["--option", "maxBytesPerTrigger=40000", "--exclude-tables", r".*_full"]
    command += ["--on-table-error", "isolate", "--progress-json", str(progress)]
    command += ["--table-mode", "cdc_small=scd2"]
    command += ["--target", f"{lake}/{{db}}/{{schema}}/{{table}}", "--checkpoint", str(tmp_path / "ck")]
    assert main(command) == 3
    err = capsys.readouterr().err
    final = json.loads((POSTGRES / "expected.json").read_text())["final"]
    tables = lake / "cdcflow" / "inventory"
    assert {"cdc_small", "cdc_types"} <= {p.name for p in tables.iterdir()}
    assert not (tables / "cdc_types_full").exists()
    history = DeltaTable(str(tables / "cdc_small")).to_pyarrow_table().to_pylist()
    assert [{"id": r["id"], "label": r["label"]} for r in history if r["__END_AT"] is None] == [
        {"id": 99, "label": "end"}
    ]
    assert len(history) > 1 and all(r["__START_AT"] is not None for r in history), history
    rows = table_rows(tables / "cdc_types")
    want = sorted(final["cdc_types"]["text"], key=lambda row: str(row["id"]))
    assert [(r["id"], r["c_text"], r["c_bigint"]) for r in rows] == [
        (int(r["id"]), r["c_text"], int(r["c_bigint"])) for r in want
    ]
    summary = err.splitlines()[-1]
    assert "3 tables" in summary and "left out: cdcflow.inventory.cdc_types_full" in summary, summary
    assert "ISOLATED 1 table: cdcflow.inventory.cdc_bad (" in summary, summary
    isolated = json.loads(
        (tmp_path / "ck" / "isolated" / "cdcflow.inventory.cdc_bad.isolated.json").read_text()
    )
    assert isolated["table"] == "cdcflow.inventory.cdc_bad" and "cdc_bad" in isolated["reason"]
    assert "[cdcflow.inventory.cdc_types] primary key (id), named by the messages" in err
    assert "[cdcflow.inventory.cdc_types] batches: 2," in err, "several micro-batches"
    assert "[cdcflow.inventory.cdc_small] done:" in err and "[cdcflow.inventory.cdc_types] done:" in err
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    by_table: dict[str, int] = {}
    for line in lines:
        by_table[line["table"]] = by_table.get(line["table"], 0) + line["changes"]
    assert set(by_table) <= {f"cdcflow.inventory.{t}" for t in ("cdc_small", "cdc_types", "cdc_bad")}
    for name in ("cdc_small", "cdc_types"):
        done = next(
            line
            for line in err.splitlines()
            if line.startswith(f"cdcflow ingest: [cdcflow.inventory.{name}] done:")
        )
        assert f", {by_table[f'cdcflow.inventory.{name}']:,} changes" in done, (done, by_table)
    # the rerun finds nothing new in the landed tables, and retries the isolated one
    assert main(command) == 3
    again = capsys.readouterr().err
    assert "[cdcflow.inventory.cdc_types] done: nothing new since the last run" in again
    assert "ISOLATED 1 table: cdcflow.inventory.cdc_bad" in again.splitlines()[-1]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--target", "/lake/t", "--topic-pattern", "x.*"], "--topic-pattern is for a whole database"),
        (["--target", "/lake/{tabel}"], "unknown placeholder {tabel}"),
        (["--target", "/lake/{table}", "--exclude-tables", "("], "--exclude-tables '(' is no regular"),
        (["--target", "/lake/{table}", "--table-key", "items"], "--table-key 'items' must look like"),
        (["--target", "/lake/{table}", "--path", str(BUNDLED)], "reads a folder of recorded topics"),
    ],
)
def test_whole_database_flags_are_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    given = ["--path", str(tmp_path), "--checkpoint", str(tmp_path / "ck")]
    if "--path" in flags:
        given = given[2:]
    assert main(["ingest", *given, *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


TESTDATA = Path(__file__).parents[2] / "formats" / "testdata"


def canal_fold(path: Path) -> dict[str, dict[str, dict[str, str]]]:
    """What each table of a Canal recording holds at its end, as ``{qualified: {key: row}}``: the
    messages' rows applied by their ``pkNames`` (INSERT, UPDATE's new rows, DELETE), values as sent."""
    tables: dict[str, dict[str, dict[str, str]]] = {}
    for line in path.read_text().splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        if message.get("type") not in ("INSERT", "UPDATE", "DELETE"):
            continue
        rows = tables.setdefault(f"{message['database']}.{message['table']}", {})
        for row in message["data"]:
            key = ",".join(row[column] for column in message["pkNames"])
            if message["type"] == "DELETE":
                rows.pop(key, None)
            else:
                rows[key] = row
    return tables


def test_canal_topics_shared_by_several_tables_land_each_table_in_its_own_delta_table(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Canal publishes a database's tables into one topic: Flink's recording of four tables of ``mydb``
    and Paimon's of four tables of ``paimon_sync_database_affix``, each a topic, land in a Delta table
    per table, keys from ``pkNames``, columns from ``mysqlType``; the table whose ids are not numbers
    (Flink's test of a filter) is left out by --exclude-tables before any of its messages is decoded."""
    folder = tmp_path / "topics"
    folder.mkdir()
    flink = TESTDATA / "flink" / "canal-data-filter-table.txt"
    paimon = TESTDATA / "apache_paimon" / "kafka" / "canal" / "database" / "include" / "topic0"
    shutil.copy(flink, folder / "mydb.jsonl")
    shutil.copy(paimon / "canal-data-1.stripped.txt", folder / "paimon.jsonl")
    lake = tmp_path / "lake"
    command = [
        "ingest",
        "--format",
        "canal-json",
        "--path",
        str(folder),
        "--exclude-tables",
        r"mydb\.project",
    ]
    command += ["--target", f"{lake}/{{db}}/{{table}}", "--checkpoint", str(tmp_path / "ck")]
    assert main(command) == 0
    err = capsys.readouterr().err
    want = {**canal_fold(flink), **canal_fold(paimon / "canal-data-1.stripped.txt")}
    del want["mydb.project"]
    landed = {f"{db.name}.{table.name}" for db in lake.iterdir() for table in db.iterdir()}
    assert landed == set(want) and len(landed) == 6, landed
    for name, rows in want.items():
        table = DeltaTable(str(lake / name.replace(".", "/"))).to_pyarrow_table().to_pylist()
        key = "order_number" if name == "mydb.orders" else "k1" if name.startswith("paimon") else "id"
        label = "v0" if name.startswith("paimon") else "product_id" if name == "mydb.orders" else "name"
        got = {str(row[key]): None if row[label] is None else str(row[label]) for row in table}
        assert got == {key: row[label] for key, row in rows.items()}, name
    assert "[mydb.orders] primary key (order_number), named by the messages" in err
    assert "left out: mydb.project" in err.splitlines()[-1]


def test_a_maxwell_topic_shared_by_several_tables_lands_each_in_its_own_delta_table(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Paimon's Maxwell recording of four tables in one topic: keys from ``primary_key_columns``; Maxwell
    sends no types, so the columns are declared (every table of this recording has the same ones)."""
    recorded = TESTDATA / "apache_paimon" / "kafka" / "maxwell" / "database" / "include" / "topic0"
    folder = tmp_path / "topics"
    folder.mkdir()
    shutil.copy(recorded / "maxwell-data-1.stripped.txt", folder / "maxwell.jsonl")
    lake = tmp_path / "lake"
    command = ["ingest", "--format", "maxwell-json", "--path", str(folder)]
    command += ["--schema", "id INT NOT NULL, name STRING, description STRING, weight DOUBLE"]
    command += ["--target", f"{lake}/{{table}}", "--checkpoint", str(tmp_path / "ck")]
    assert main(command) == 0
    err = capsys.readouterr().err
    messages = [json.loads(line) for line in (folder / "maxwell.jsonl").read_text().splitlines()]
    assert len({m["table"] for m in messages}) >= 3
    for message in messages:
        assert f"[{message['database']}.{message['table']}] primary key (id), named by the messages" in err
        rows = DeltaTable(str(lake / message["table"])).to_pyarrow_table().to_pylist()
        assert rows == [message["data"]], message["table"]


def test_inspect_tables_lists_what_a_whole_database_ingest_would_land(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run of the routing, with no Spark: each table of the folder's shared Canal topics with its
    key (``pkNames``), columns (``mysqlType``) and target; the table that cannot be read says why."""
    folder = tmp_path / "topics"
    folder.mkdir()
    shutil.copy(TESTDATA / "flink" / "canal-data-filter-table.txt", folder / "mydb.jsonl")
    command = ["inspect", "--tables", "--format", "canal-json", "--path", str(folder)]
    assert main([*command, "--target", "/lake/{db}/{table}"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "mydb.product: topic mydb, key (id, named by the messages), target /lake/mydb/product" in out
    assert "    columns: id INT, name STRING, description STRING, weight FLOAT" in out
    assert any(line.startswith("mydb.orders: topic mydb, key (order_number, named by") for line in out)
    assert "mydb/mydb.projects: no change yet" in out  # its one message is its CREATE TABLE
    assert any(line.startswith("mydb/mydb.project: cannot be ingested:") and "'A101'" in line for line in out)


@pytest.mark.process
def test_a_continuous_job_picks_up_a_table_that_appears_and_ctrl_c_stops_every_table(tmp_path: Path) -> None:
    """``--trigger continuous`` over a folder: a topic's file added while the job runs becomes a table
    within a discovery round, from its first change; SIGINT stops both tables and exits 130."""
    import signal
    import time

    from ingest_process import start_ingest, tail, wait_for

    topics = postgres_topics()
    folder, lake = tmp_path / "topics", tmp_path / "lake"
    folder.mkdir()
    write_dump(folder / "small.dump.jsonl", topics["cdcflow.inventory.cdc_small"])
    args = ["--path", str(folder), "--option", "schema-include=true", "--trigger", "continuous"]
    args += ["--target", f"{lake}/{{table}}", "--checkpoint", str(tmp_path / "ck")]
    job = start_ingest(args, tmp_path / "run.log")
    try:
        wait_for(job, 120, lake / "cdc_small")
        staged = tmp_path / "types.dump.jsonl"  # written whole, then moved in: the job never sees half
        write_dump(staged, topics["cdcflow.inventory.cdc_types"])
        staged.rename(folder / "types.dump.jsonl")
        wait_for(job, 120, lake / "cdc_types")
        deadline = time.monotonic() + 60
        while len(table_rows(lake / "cdc_types")) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job.poll() is None, tail(tmp_path / "run.log")
        os.killpg(job.pid, signal.SIGINT)
        assert job.wait(timeout=120) == 130, tail(tmp_path / "run.log")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    log = (tmp_path / "run.log").read_text()
    assert "Ctrl-C: stopping every table" in log and "Traceback" not in log, tail(tmp_path / "run.log")
    assert [row["id"] for row in table_rows(lake / "cdc_small")] == [99]
    assert [row["id"] for row in table_rows(lake / "cdc_types")] == [1, 10, 20, 4]
