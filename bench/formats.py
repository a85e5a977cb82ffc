"""Decode throughput per format on recorded-shape messages, against raw ``orjson.loads`` of the same lines.

Each case takes a real recorded file (tests/formats/testdata, tests/formats/recorded), repeats its
messages with fresh ids up to ``--messages`` lines, and times (a) ``orjson.loads`` over every line and
(b) the format's decoder over the same lines, in the same run. The ratio decoder/baseline is what to
track, since these machines are shared and absolute numbers drift. For the Avro format the baseline is
``fastavro.schemaless_reader`` over the same payloads.

    .venv/bin/python bench/formats.py [--messages 100000] [--only debezium-json]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl, resolve_format

ROOT = Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "tests" / "formats" / "testdata"
RECORDED = ROOT / "tests" / "formats" / "recorded" / "postgres"
PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"


@dataclass
class Case:
    name: str
    format: str
    lines: Callable[[int], list[bytes]]
    schema: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    keys: bool = False


def _repeat(
    source: list[dict[str, Any]], n: int, renumber: Callable[[dict[str, Any], int], None]
) -> list[bytes]:
    out = []
    for i in range(n):
        envelope = json.loads(json.dumps(source[i % len(source)]))
        renumber(envelope, i)
        out.append(orjson.dumps(envelope))
    return out


def _file(relative: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (TESTDATA / relative).read_text().splitlines() if line.strip()]


def _debezium_ids(envelope: dict[str, Any], i: int) -> None:
    payload = envelope.get("payload", envelope)
    for image in ("before", "after"):
        if payload.get(image):
            payload[image]["id"] = i


def _rows_ids(field_name: str) -> Callable[[dict[str, Any], int], None]:
    def renumber(envelope: dict[str, Any], i: int) -> None:
        rows = envelope.get(field_name)
        for row in rows if isinstance(rows, list) else [rows] if isinstance(rows, dict) else []:
            if "id" in row:
                row["id"] = str(i) if isinstance(row["id"], str) else i
        old = envelope.get("old")
        for row in old if isinstance(old, list) else []:
            if "id" in row:
                row["id"] = str(i)

    return renumber


def _postgres_values(run: str) -> list[dict[str, Any]]:
    values = []
    for line in (RECORDED / f"{run}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["topic"] == "cdcflow.inventory.cdc_types_full" and record["value"]:
            value = json.loads(record["value"])
            payload = value.get("payload", value)
            if payload.get("op") != "t" and len(record["value"]) < 20_000:
                values.append(value)
    return values


CASES = [
    Case(
        "debezium-json (products)",
        "debezium-json",
        lambda n: _repeat(_file("flink/debezium-data-schema-exclude.txt"), n, _debezium_ids),
        PRODUCTS,
    ),
    Case(
        "debezium-json schema-include (products)",
        "debezium-json",
        lambda n: _repeat(_file("flink/debezium-data-schema-include.txt"), n, _debezium_ids),
        None,
        {"schema-include": "true"},
    ),
    Case(
        "debezium-json schema-include (postgres, 25 types)",
        "debezium-json",
        lambda n: _repeat(_postgres_values("schemas"), n, _debezium_ids),
        None,
        {"schema-include": "true", "unavailable-values": "report"},
    ),
    Case(
        "canal-json",
        "canal-json",
        lambda n: _repeat(
            [e for e in _file("flink/canal-data.txt") if not e.get("isDdl")], n, _rows_ids("data")
        ),
        PRODUCTS,
    ),
    Case(
        "maxwell-json",
        "maxwell-json",
        lambda n: _repeat(_file("flink/maxwell-data.txt"), n, _rows_ids("data")),
        PRODUCTS,
    ),
    Case(
        "ogg-json",
        "ogg-json",
        lambda n: _repeat(_file("flink/ogg-data.txt"), n, _debezium_ids),
        PRODUCTS,
    ),
]


def _generic_lines(n: int) -> list[bytes]:
    ops = ["c", "u", "u", "d"]
    return [
        orjson.dumps({"id": i // 4, "name": f"n{i}", "description": "d", "weight": 1.5, "__op": ops[i % 4]})
        for i in range(n)
    ]


def _upsert_lines(n: int) -> list[tuple[bytes, bytes | None]]:
    return [
        (orjson.dumps({"id": i // 2}), None if i % 10 == 9 else orjson.dumps({"id": i // 2, "name": f"n{i}"}))
        for i in range(n)
    ]


def _time(function: Callable[[], Any]) -> float:
    gc.collect()
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _parse_all(lines: list[bytes]) -> None:
    loads = orjson.loads
    for line in lines:
        loads(line)


def run_case(case: Case, n: int) -> None:
    lines = case.lines(n)
    messages = _messages(lines)
    factory = resolve_format(case.format)
    decoder = factory.create_decoder(case.options, parse_ddl(case.schema) if case.schema else None)
    _report(case.name, n, lines, lambda: decoder.decode_all(messages))


def run_generic(n: int) -> None:
    lines = _generic_lines(n)
    messages = _messages(lines)
    decoder = resolve_format("generic").create_decoder({"preset": "debezium-unwrap"}, parse_ddl(PRODUCTS))
    _report("generic (debezium unwrap)", n, lines, lambda: decoder.decode_all(messages))


def run_upsert_kafka(n: int) -> None:
    pairs = _upsert_lines(n)
    decoder = resolve_format("upsert-kafka").create_decoder(
        {"key.fields": "id"}, parse_ddl("id INT NOT NULL, name STRING")
    )
    messages = [Message(v, key=k, topic="bench", partition=0, offset=i) for i, (k, v) in enumerate(pairs)]
    lines = [v if v is not None else k for k, v in pairs]
    _report("upsert-kafka (json, 10% tombstones)", n, lines, lambda: decoder.decode_all(messages))


def run_avro(n: int) -> None:
    import fastavro

    factory = resolve_format("debezium-avro-confluent")
    schema = parse_ddl(PRODUCTS)
    encoder = factory.create_encoder({"schema-id": "1"}, schema, ["id"])
    changes = []
    for i in range(n):
        row = {"id": i, "name": "scooter", "description": "Small 2-wheel scooter", "weight": 3.14}
        changes.append(Change(RowKind.INSERT, row))
    payloads = [e.value for e in encoder.encode_all(changes) if e.value is not None]
    writer = encoder.writer_schema  # type: ignore[attr-defined]
    decoder = factory.create_decoder({"schema": writer, "schema-id": "1"}, None)
    parsed = fastavro.parse_schema(json.loads(writer))
    messages = _messages(payloads)

    def baseline() -> None:
        for payload in payloads:
            fastavro.schemaless_reader(io.BytesIO(payload[5:]), parsed, None)

    base = min(_time(baseline) for _ in range(2))
    out_holder: list[Any] = []
    elapsed = min(_time(lambda: out_holder.append(decoder.decode_all(messages))) for _ in range(2))
    print(
        f"{'debezium-avro-confluent (products, inserts)':<52} {n / base / 1e3:>8.0f}k msg/s fastavro "
        f"{n / elapsed / 1e3:>6.0f}k msg/s decoded ({out_holder[-1].metrics.changes / elapsed / 1e3:>5.0f}k "
        f"changes/s)  ratio {base / elapsed:.2f}"
    )


def _messages(lines: list[bytes]) -> list[Message]:
    return [Message(line, topic="bench", partition=0, offset=i) for i, line in enumerate(lines)]


def _report(name: str, n: int, lines: list[bytes], decode: Callable[[], Any]) -> None:
    baseline = min(_time(lambda: _parse_all(lines)) for _ in range(2))
    out_holder: list[Any] = []
    elapsed = min(_time(lambda: out_holder.append(decode())) for _ in range(2))
    out = out_holder[-1]
    assert out.metrics.dead_letters == 0 and out.metrics.messages == n
    print(
        f"{name:<52} {n / baseline / 1e3:>8.0f}k msg/s orjson  {n / elapsed / 1e3:>7.0f}k msg/s decoded "
        f"({out.metrics.changes / elapsed / 1e3:>5.0f}k changes/s)  ratio {baseline / elapsed:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--only", help="run the cases whose name contains this")
    args = parser.parse_args()
    print(f"{args.messages} messages per case; best of 2 runs; ratio = decoder msg/s / orjson.loads msg/s")
    for case in CASES:
        if args.only and args.only not in case.name:
            continue
        run_case(case, args.messages)
    extra = {"generic": run_generic, "upsert-kafka": run_upsert_kafka, "debezium-avro": run_avro}
    for name, run in extra.items():
        if not args.only or args.only in name:
            run(args.messages)


if __name__ == "__main__":
    main()
