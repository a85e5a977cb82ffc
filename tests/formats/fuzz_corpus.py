"""Hostile input for every format: the recorded corpora, a seeded mutator, and a harness that checks
what became of each mutated message.

Shared by ``tests/formats/test_fuzz.py`` (a short run in the suite) and ``bench/fuzz.py`` (the long
run; it puts ``tests/formats`` on its ``sys.path`` to import this module, as pytest does).

- :func:`targets`: one decoder configuration per recorded input — the golden cases of
  ``tests/formats/golden`` (Debezium with and without schema blocks, Canal, Maxwell, OGG), the
  PostgreSQL recordings (``tests/formats/recorded/postgres``, also as ``cdcflow ingest`` reads them:
  the columns and metadata of the columnar path), the recorded workload dumps
  (``tests/connectors/lakehouse/recorded``), Debezium Avro (``avro_events.py``), Debezium JSON in
  Confluent's JSON Schema framing (validated), and ``generic`` and ``upsert-kafka`` rows made from the
  Debezium and Maxwell images — each with and without every metadata column the configuration takes,
  always with ``ignore-parse-errors``.
- :class:`Mutator`: byte flips, truncation, invalid UTF-8, wrong JSON types, lists where scalars
  belong, huge numbers (integers over 4,300 digits), numbers beyond FLOAT, numeric text in other
  scripts' digits or with control characters, deep nesting (also as JSON text inside a string),
  extreme timestamps and epochs, log positions beyond BIGINT, broken Kafka Connect schema blocks, very
  long values, mutated keys.
- :func:`run_target`: decodes mutated messages one by one and tallies outcomes, raised exceptions,
  slow messages, the counters' accounting and whether each dead letter kept its exact bytes and
  coordinates.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import gzip
import hashlib
import json
import random
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from cdcflow.formats import DecodeOutput, Message, parse_ddl, resolve_format
from cdcflow.formats.base import Decoder, FormatMetrics

HERE = Path(__file__).resolve().parent
POSTGRES = HERE / "recorded" / "postgres"
WORKLOAD = HERE.parent / "connectors" / "lakehouse" / "recorded"

# --- the corpus ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A decoder configuration and the recorded messages to mutate for it."""

    name: str
    format: str
    options: Mapping[str, str]
    ddl: str | None
    seeds: tuple[Message, ...]
    metadata: tuple[str, ...] = ()
    avro: bool = False
    prefix: bytes = b""
    """Bytes before each seed's JSON (Confluent's framing) that mutations of the JSON keep."""

    def decoder(self) -> Decoder:
        factory = resolve_format(self.format)
        options = {**self.options, "ignore-parse-errors": "true"}
        return factory.create_decoder(options, parse_ddl(self.ddl) if self.ddl else None, self.metadata)


def targets() -> list[Target]:
    """Every configuration to fuzz, each without and with all the metadata columns it takes."""
    plain = [*_golden(), *_postgres(), *_workload(), *_avro(), *_registry(), *_generic_and_upsert()]
    out = []
    for target in plain:
        out.append(target)
        keys = _metadata_taken(target)
        if keys and keys != target.metadata:
            out.append(replace(target, name=f"{target.name}+metadata", metadata=keys))
    return out


def _metadata_taken(target: Target) -> tuple[str, ...]:
    """The format's metadata columns the target's configuration takes (some clash with a table column,
    ``schema`` needs schema blocks), or none if they do not go together."""
    every = tuple(column.key for column in resolve_format(target.format).metadata_columns)
    if not every or _takes(target, every):
        return every
    keys = tuple(key for key in every if _takes(target, (key,)))
    return keys if keys and _takes(target, keys) else ()


def _takes(target: Target, metadata: tuple[str, ...]) -> bool:
    try:
        replace(target, metadata=metadata).decoder()
    except Exception:  # a metadata column this configuration refuses
        return False
    return True


def _golden() -> list[Target]:
    from golden_cases import all_cases

    seen: dict[tuple[str, str, str, str], Target] = {}
    for case in all_cases():
        prefix = f"{case.format}."
        options = {
            (k[len(prefix) :] if k.startswith(prefix) else k): v
            for k, v in case.options.items()
            if not k.endswith("ignore-parse-errors")
        }
        signature = (case.format, case.input, case.schema_ddl, json.dumps(options, sort_keys=True))
        if signature in seen:
            continue
        seeds = tuple(case.messages())
        if seeds:
            seen[signature] = Target(case.case_id, case.format, options, case.schema_ddl, seeds)
    return list(seen.values())


def _postgres() -> list[Target]:
    from test_postgres_recorded import DECLARED, recorded

    out = []
    for run, options, ddl in (
        ("schemas", {"schema-include": "true"}, None),
        ("no-schemas", {}, DECLARED),
        ("connect-time", {"schema-include": "true"}, None),
    ):
        for table in ("cdc_types", "cdc_types_full"):
            seeds = tuple(m for m in recorded(run) if m.topic == f"cdcflow.inventory.{table}")
            mode = {"changelog-mode": "upsert"} if table == "cdc_types" else {}
            declared = ddl if table != "cdc_types" or ddl is None else ddl
            out.append(
                Target(f"postgres-{run}-{table}", "debezium-json", {**options, **mode}, declared, seeds)
            )
    ingest = {"changelog-mode": "upsert", "unavailable-values": "report"}
    for name, run, options in (
        ("postgres-ingest-columnar", "no-schemas", ingest),
        ("postgres-ingest-columnar-schemas", "schemas", {**ingest, "schema-include": "true"}),
    ):
        seeds = tuple(m for m in recorded(run) if m.topic.startswith("cdcflow.inventory.cdc_types"))
        out.append(Target(name, "debezium-json", options, COLUMNAR_COLUMNS, seeds, INGEST_METADATA))
    return out


#: The recorded PostgreSQL columns the columnar path reads (no DECIMAL, BINARY or nested types).
COLUMNAR_COLUMNS = (
    "id INT NOT NULL, c_real FLOAT, c_double DOUBLE, c_smallint SMALLINT, c_bigint BIGINT, "
    "c_boolean BOOLEAN, c_date DATE, c_time TIME(6), c_time3 TIME(3), c_timestamp TIMESTAMP_NTZ(6), "
    "c_timestamp3 TIMESTAMP_NTZ(3), c_json STRING, c_jsonb STRING, c_uuid STRING, c_text STRING, "
    "c_varchar STRING, c_enum STRING, big_text STRING, big_jsonb STRING"
)
#: The metadata ``cdcflow ingest`` asks of Debezium, and the other columns the columnar path computes.
INGEST_METADATA = (
    "source.sequence",
    "source.timestamp",
    "unavailable-columns",
    "old-key",
    "new-key",
    "source.lsn",
    "ingestion-timestamp",
)


def _workload(per_file: int = 150) -> list[Target]:
    out = []
    for name, mode in (("items_default", {"changelog-mode": "upsert"}), ("items_full", {})):
        seeds = []
        with gzip.open(WORKLOAD / f"{name}.dump.jsonl.gz", "rb") as lines:
            next(lines)  # the dump header
            for line in lines:
                record = orjson.loads(line)
                seeds.append(
                    Message(
                        _unbase64(record["value"]),
                        key=_unbase64(record["key"]),
                        topic=record["topic"],
                        partition=record["partition"],
                        offset=record["offset"],
                    )
                )
                if len(seeds) == per_file:
                    break
        out.append(
            Target(
                f"workload-{name}", "debezium-json", {"schema-include": "true", **mode}, None, tuple(seeds)
            )
        )
    return out


def _unbase64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _avro() -> list[Target]:
    import avro_events

    seeds = tuple(avro_events.messages())
    options = {"schema": avro_events.ENVELOPE_TEXT}
    return [
        Target("avro-explicit", "debezium-avro-confluent", options, None, seeds, avro=True),
        Target(
            "avro-declared", "debezium-avro-confluent", options, avro_events.INFERRED_DDL, seeds, avro=True
        ),
    ]


def _registry() -> list[Target]:
    """``debezium-json-registry`` with validation: the recorded PostgreSQL envelopes in Confluent's
    JSON Schema framing, read with the writer schemas of ``test_debezium_json_registry.py``."""
    from test_debezium_json_registry import SMALL_SCHEMA, TYPES_SCHEMA, framed, messages

    return [
        Target(
            "registry-small",
            "debezium-json-registry",
            {"schema": SMALL_SCHEMA, "validate": "true"},
            "id INT NOT NULL, label STRING",
            tuple(messages(17, "cdc_small")),
            prefix=framed(17, b""),
        ),
        Target(
            "registry-types",
            "debezium-json-registry",
            {"schema": TYPES_SCHEMA, "validate": "true"},
            None,
            tuple(messages(3, "cdc_types", topic="cdcflow.inventory.cdc_types")),
            prefix=framed(3, b""),
        ),
    ]


def _generic_and_upsert() -> list[Target]:
    """``generic`` and ``upsert-kafka`` rows: the images of the Debezium and Maxwell golden inputs."""
    from golden_cases import all_cases

    out = []
    done = set()
    for case in all_cases():
        if case.format not in ("debezium-json", "maxwell-json") or case.input in done:
            continue
        if case.options.get("debezium-json.schema-include") == "true":
            continue
        done.add(case.input)
        images = []
        for message in case.messages():
            try:
                envelope = orjson.loads(message.value or b"")
            except orjson.JSONDecodeError:
                continue
            if not isinstance(envelope, dict):
                continue
            op = envelope.get("op", envelope.get("type"))
            image = envelope.get("after") or envelope.get("before") or envelope.get("data")
            if isinstance(image, dict) and isinstance(op, str):
                images.append((op, image, message))
        if not images:
            continue
        schema = parse_ddl(case.schema_ddl)
        key = schema.names[0]
        generic, flagged, upserts = [], [], []
        for op, image, message in images:
            deleted = op in ("d", "delete")
            generic.append(_at(message, orjson.dumps({**image, "op": op[0]})))
            flagged.append(_at(message, orjson.dumps({**image, "deleted": deleted})))
            upserts.append(
                Message(
                    None if deleted else orjson.dumps(image),
                    key=orjson.dumps({key: image.get(key)}),
                    topic=case.input,
                    partition=0,
                    offset=message.line,
                )
            )
        name = case.case_id
        ops = {"op-mapping": "c,r,i=INSERT;d=DELETE;u=UPDATE_AFTER", "key-columns": key}
        out += [
            Target(f"generic-{name}", "generic", ops, case.schema_ddl, tuple(generic)),
            Target(
                f"generic-skip-{name}",
                "generic",
                {**ops, "invalid-op-handling": "SKIP"},
                case.schema_ddl,
                tuple(generic),
            ),
            Target(
                f"generic-flag-{name}",
                "generic",
                {
                    "op-field": "deleted",
                    "op-mapping": "false=INSERT,UPDATE_AFTER;true=DELETE",
                    "key-columns": key,
                },
                case.schema_ddl,
                tuple(flagged),
            ),
            Target(
                f"upsert-kafka-{name}", "upsert-kafka", {"key.fields": key}, case.schema_ddl, tuple(upserts)
            ),
        ]
    return out


def _at(message: Message, value: bytes) -> Message:
    return Message(value, file=message.file, line=message.line)


# --- the mutator --------------------------------------------------------------------------------------


class Raw:
    """JSON text put into a document as is (numbers and nestings orjson cannot write); not a dataclass,
    which orjson would write itself."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text


EXTREME_TIMES = (
    "0001-01-01T00:00:00+01:00",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999-01:00",
    "9999-12-31T23:59:59.999999999Z",
    "0000-00-00 00:00:00",
    "2024-02-30T00:00:00Z",
    "1970-01-01T00:00:00+25:00",
    "+99999-01-01T00:00:00Z",
    "-0001-01-01",
    "2024-01-01 24:00:00",
    "23:59:60.999999999",
    "24:00:00.000001",
    "0001-01-01",
    "9999-12-31",
    "2024-01-01T00:00:00.1234567890123Z",
)
EPOCHS = (
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    253_402_300_800_000,
    -62_135_596_800_001,
    10**18,
    -(10**18),
    2**53 + 1,
    86_400_000_000_001,
    -1,
    1e20,
    -1e300,
)
SCALARS: tuple[Any, ...] = (
    [],
    {},
    [1, 2],
    {"a": 1},
    "text",
    "",
    True,
    False,
    None,
    0,
    -1,
    1.5,
    "NaN",
    " 12 ",
    "-0",
)
#: Numeric text that is no number: other scripts' digits (Python's int/float/Decimal read them),
#: control characters str.strip() removes but float() does not, digit separators.
ODD_NUMBER_TEXTS = (
    "１",
    "-１２.５",
    "١٢٣",
    "1\x1c",
    "\x1f2.5",
    " 3\x85",
    "1_000",
    "0x10",
    "１e５",
    "\u3000" + "7",
)
#: Numbers a double holds and a FLOAT does not (the largest FLOAT is about 3.4028235e38).
BEYOND_FLOAT: tuple[Any, ...] = (1e39, -3.5e38, 1.7976931348623157e308)
#: A log position's fields (each with the connector that reads it) set to what no BIGINT holds.
POSITION_EDITS: tuple[tuple[str, str, Any], ...] = (
    ("postgresql", "lsn", 2**64 - 1),
    ("postgresql", "lsn", True),
    ("postgresql", "lsn", 2**63),
    ("postgresql", "sequence", '["99999999999999999999","1"]'),
    ("postgresql", "sequence", '[null,"9223372036854775808"]'),
    ("postgresql", "sequence", '["1","１"]'),
    ("postgresql", "sequence", [True, "1"]),
    ("sqlserver", "commit_lsn", "ffffffffffffffffff:0:0"),
    ("sqlserver", "change_lsn", "0:8000000000000000:0"),
    ("mysql", "pos", 1e79),
    ("mysql", "file", "mysql-bin." + "9" * 30),
    ("mysql", "row", 2**63),
    ("oracle", "scn", "12345678901234567890"),
    ("oracle", "commit_scn", "99999999999999999999"),
)
INVALID_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80")
OPS = ("c", "u", "d", "r", "t", "m", "INSERT", "UPDATE", "DELETE", "I", "U", "D", "T", "insert", "update")
OPS += ("delete", "bootstrap-insert", "bootstrap-start", "CREATE", "INIT", "+I", "u ", "")
#: Keys whose values a format reads: mutated more often than others.
KEYS = frozenset(
    "op type data old before after payload schema mysqlType sqlType pkNames ts ts_ms ts_us ts_ns source "
    "table database isDdl xid commit primary_keys op_type current_ts pos fields field parameters scale "
    "value name optional id es".split()
)
CONNECT_EDITS: tuple[tuple[str, Any], ...] = (
    ("fields", "x"),
    ("fields", []),
    ("fields", [1]),
    ("fields", [{"type": "struct"}]),
    ("fields", [{"field": "id"}]),
    ("fields", [{"type": "int32", "field": ["id"]}]),
    ("type", ["int32"]),
    ("type", "unknown"),
    ("type", None),
    ("type", "bytes"),
    ("type", "int64"),
    ("type", "string"),
    ("parameters", {"scale": "99999999999"}),
    ("parameters", {"scale": "-5"}),
    ("parameters", {"scale": []}),
    ("parameters", {"scale": "2", "connect.decimal.precision": "x"}),
    ("parameters", {"scale": "2", "connect.decimal.precision": "1"}),
    ("parameters", {"scale": "1000000"}),
    ("parameters", "x"),
    ("name", "org.apache.kafka.connect.data.Decimal"),
    ("name", "io.debezium.data.VariableScaleDecimal"),
    ("name", "io.debezium.time.ZonedTimestamp"),
    ("name", "io.debezium.time.MicroTimestamp"),
    ("name", "io.debezium.time.Date"),
    ("name", "org.apache.kafka.connect.data.Timestamp"),
    ("name", ["x"]),
    ("optional", "yes"),
    ("version", "x"),
    ("items", "x"),
    ("keys", {"type": []}),
)


def deep(depth: int, kind: str = "[") -> bytes:
    if kind == "[":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


class Mutator:
    """Seeded mutations of a message; ``big`` bounds the very long values and deep nestings (the suite
    keeps it small, the bench does not)."""

    def __init__(self, seed: int, *, big: int = 100_000) -> None:
        self.rng = random.Random(seed)  # noqa: S311 - a reproducible fuzz, not a secret
        self.big = big

    # Values that break things when put anywhere in a document.
    def hostile(self) -> Any:
        rng = self.rng
        roll = rng.randrange(13)
        if roll == 0:
            return rng.choice(SCALARS)
        if roll == 1:
            return [rng.choice(SCALARS)]
        if roll == 2:  # huge numbers, as JSON text
            digits = rng.choice((19, 20, 30, 400, 4301, 5000, min(self.big, 50_000)))
            text = rng.choice(
                ("1" + "0" * digits, "-" + "9" * digits, "1." + "1" * digits, "1e" + str(digits))
            )
            return Raw(text.encode())
        if roll == 3:
            return Raw(rng.choice((b"1e999", b"-1e-999", b"1E+2147483648", b"0.1e-2147483649", b"-0.0")))
        if roll == 4:
            return rng.choice(EXTREME_TIMES)
        if roll == 5:
            epoch = rng.choice(EPOCHS)
            return Raw(str(epoch).encode()) if isinstance(epoch, int) and abs(epoch) >= 2**63 else epoch
        if roll == 6:  # deep nesting, as JSON or as JSON text in a string
            depth = rng.choice((100, 257, 300, 600, 1000, 1024, min(self.big, 5000)))
            nested = deep(depth, rng.choice("[{"))
            return nested.decode() if rng.random() < 0.4 else Raw(nested)
        if roll == 7:  # very long values
            size = rng.choice((1000, 10_000, self.big))
            pick = rng.randrange(4)
            if pick == 0:
                return "x" * size
            if pick == 1:
                return base64.b64encode(rng.randbytes(size * 3 // 4)).decode()
            if pick == 2:
                return "é" * (size // 2)
            return "9" * size
        if roll == 8:  # a VariableScaleDecimal / Connect Decimal with hostile parts
            scale = rng.choice((2**31 - 1, -(2**31), 10**6, 400, -400, "x", None, 1.5))
            value = rng.choice(
                ("AA==", "", "!!", base64.b64encode(rng.randbytes(rng.choice((1, 64, 4096)))).decode())
            )
            return {"scale": scale, "value": value}
        if roll == 9:
            return Raw(rng.choice((b'"\\ud800"', b'"\\u0000"', b'"a\\udfffb"', b"[1,]", b'"\\x41"')))
        if roll == 10:
            return rng.choice(ODD_NUMBER_TEXTS)
        if roll == 11:
            return rng.choice(BEYOND_FLOAT)
        return rng.choice(OPS)

    def message(self, target: Target, index: int) -> Message:
        """A mutated copy of one of the target's seeds, at coordinates unique to ``index``."""
        rng = self.rng
        seed = rng.choice(target.seeds)
        value, key = seed.value, seed.key
        if rng.random() >= 0.1:  # one message in ten is left as recorded
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                roll = rng.random()
                framed = value is not None and bool(target.prefix) and value.startswith(target.prefix)
                if roll < 0.15 and target.format != "debezium-avro-confluent":
                    key = self.mutate_key(key)
                elif target.avro and roll < 0.6:
                    value = self.mutate_avro(value)
                elif framed and roll < 0.75:
                    assert value is not None
                    value = target.prefix + self.mutate_json(value[len(target.prefix) :])
                elif value is not None and not target.avro and roll < 0.75:
                    value = self.mutate_json(value)
                else:
                    value = self.mutate_bytes(value or b"")
        if seed.file is not None:
            return Message(value, key=key, file=seed.file, line=index + 1, headers=seed.headers)
        return Message(
            value,
            key=key,
            topic=seed.topic or target.name,
            partition=seed.partition or 0,
            offset=index,
            timestamp_ms=seed.timestamp_ms,
            headers=seed.headers,
        )

    def mutate_bytes(self, data: bytes) -> bytes:
        rng = self.rng
        roll = rng.randrange(9)
        if roll == 0 or not data:
            return rng.choice((b"", b" \n", b"null", b"[]", b"1", b'"x"', b"{}", b"\xef\xbb\xbf{}", b"\x00"))
        at = rng.randrange(len(data))
        if roll == 1:
            flipped = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                flipped[rng.randrange(len(data))] ^= rng.randint(1, 255)
            return bytes(flipped)
        if roll == 2:
            return data[:at]
        if roll == 3:
            return data[:at] + rng.choice(INVALID_UTF8) + data[at:]
        if roll == 4:  # invalid UTF-8 inside a string
            quote = data.find(b'"', at)
            at = quote + 1 if quote >= 0 else at
            return data[:at] + rng.choice(INVALID_UTF8) + data[at:]
        if roll == 5:
            end = rng.randint(at, len(data))
            return data[:end] + data[at:]
        if roll == 6:
            end = rng.randint(at, len(data))
            return data[:at] + data[end:]
        if roll == 7:
            return data[:at] + rng.choice((b"\r", b"\n", b"\x00", b"\\", b'"', b"}", b"]")) + data[at:]
        return data + rng.choice((b"garbage", b"}", b"\n{}", b" " * 1000))

    def mutate_key(self, key: bytes | None) -> bytes | None:
        rng = self.rng
        if key is not None and rng.random() < 0.5:
            return self.mutate_json(key) if rng.random() < 0.7 else self.mutate_bytes(key)
        return rng.choice((None, b"", b"{", b'{"id":[1]}', b"[1]", b'{"id":null}', deep(1000), b"\xff\xfe"))

    def mutate_json(self, data: bytes) -> bytes:
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self.mutate_bytes(data)
        rng = self.rng
        holders = list(_holders(document))
        if not holders:
            return self.mutate_bytes(data)
        roll = rng.random()
        schema_blocks = [h for h in holders if isinstance(h[0], dict) and _is_connect_field(h[0])]
        sources = [h[0][h[1]] for h in holders if h[1] == "source" and isinstance(h[0][h[1]], dict)]
        if roll < 0.1 and sources:
            connector, name, position = rng.choice(POSITION_EDITS)
            source = rng.choice(sources)
            source["connector"] = connector
            source[name] = position
        elif roll < 0.2 and schema_blocks:
            holder, _ = rng.choice(schema_blocks)
            name, broken = rng.choice(CONNECT_EDITS)
            holder[name] = copy.deepcopy(broken)
        else:
            keyed = [h for h in holders if isinstance(h[0], dict) and h[1] in KEYS]
            holder, slot = rng.choice(keyed) if keyed and roll < 0.6 else rng.choice(holders)
            action = rng.random()
            if action < 0.08 and isinstance(holder, dict):
                del holder[slot]
            elif action < 0.12 and isinstance(holder, dict):
                holder["__unknown"] = self.hostile()
            else:
                holder[slot] = self.hostile()
        try:
            return dumps(document)
        except TypeError:  # orjson writes at most 255 levels: mutate a deep document's bytes instead
            return self.mutate_bytes(data)

    def mutate_avro(self, data: bytes | None) -> bytes:
        """A datum of the Avro events with a hostile value the writer schema still takes."""
        import avro_events
        import fastavro

        event = copy.deepcopy(self.rng.choice(avro_events.EVENTS))
        holders = [h for h in _holders(event) if not isinstance(h[0][h[1]], (dict, list))]
        holder, slot = self.rng.choice(holders)
        holder[slot] = self.avro_value(holder[slot])
        try:
            return avro_events.confluent(42, avro_events.ENVELOPE, event)
        except (
            ValueError,
            TypeError,
            AttributeError,
            OverflowError,
            KeyError,
            fastavro.schema.SchemaParseException,
        ):
            return self.mutate_bytes(data or b"")

    def avro_value(self, value: Any) -> Any:
        rng = self.rng
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return rng.choice((0, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)))
        if isinstance(value, Decimal):
            return rng.choice((Decimal("99999999.99"), Decimal("-0.01"), Decimal("1E+30"), Decimal("1E-30")))
        if isinstance(value, str):
            return rng.choice(
                ("", "x" * self.big, "é" * 100, "0001-01-01T00:00:00+01:00", deep(1000).decode())
            )
        if isinstance(value, bytes):
            return rng.randbytes(rng.choice((0, 1, 64, self.big)))
        if isinstance(value, dt.datetime):
            return rng.choice((dt.datetime.min, dt.datetime.max)).replace(tzinfo=value.tzinfo)
        if isinstance(value, dt.date):
            return rng.choice((dt.date.min, dt.date.max))
        if isinstance(value, dt.time):
            return rng.choice((dt.time.min, dt.time.max))
        return rng.choice(SCALARS)


def _holders(document: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key or index) of a document, iteratively (documents may be deep)."""
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for name, child in node.items():
                yield node, name
                stack.append(child)
        elif isinstance(node, list):
            for index, child in enumerate(node):
                yield node, index
                stack.append(child)


def _is_connect_field(node: Mapping[str, Any]) -> bool:
    return isinstance(node.get("type"), str) and ("field" in node or "fields" in node or "optional" in node)


def dumps(document: Any) -> bytes:
    """JSON of a document holding :class:`Raw` parts."""
    raws: list[bytes] = []

    def default(value: Any) -> str:
        if isinstance(value, Raw):
            raws.append(value.text)
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(value, Decimal):
            return str(value)
        raise TypeError

    text = orjson.dumps(document, default=default)
    for index, raw in enumerate(raws):
        text = text.replace(f'"@@raw{index}@@"'.encode(), raw, 1)
    return text


# --- the harness --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """A message whose decoding raised instead of ending as an outcome."""

    target: str
    format: str
    error: str
    text: str
    where: str
    value: bytes | None
    key: bytes | None


@dataclass
class Tally:
    """What became of the mutated messages of one or more runs."""

    sent: int = 0
    metrics: FormatMetrics = field(default_factory=FormatMetrics)
    raised: list[Failure] = field(default_factory=list)
    #: (CPU seconds, wall seconds, target, message) of the slowest messages: CPU time, which other
    #: processes on a shared machine do not inflate, decides what is slow.
    slow: list[tuple[float, float, str, str]] = field(default_factory=list)
    #: Messages that took more CPU time than the run's bound.
    slow_count: int = 0
    not_exact: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)
    internal_reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        self.sent += other.sent
        for name in vars(self.metrics):
            setattr(self.metrics, name, getattr(self.metrics, name) + getattr(other.metrics, name))
        self.raised += other.raised
        self.slow = sorted([*self.slow, *other.slow], reverse=True)[:20]
        self.slow_count += other.slow_count
        self.not_exact += other.not_exact
        self.unaccounted += other.unaccounted
        for reason, count in other.internal_reasons.items():
            self.internal_reasons[reason] = self.internal_reasons.get(reason, 0) + count


def _digest(message: Message) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in (message.value, message.key):
        digest.update(b"-" if part is None else b"+%d:" % len(part))
        digest.update(part or b"")
    return digest.digest()


def run_target(
    target: Target, count: int, mutator: Mutator, *, slow_after: float = 0.1, keep_slow: int = 20
) -> Tally:
    """Decode ``count`` mutated messages of ``target`` with one decoder, message by message."""
    decoder = target.decoder()
    out = DecodeOutput()
    tally = Tally(sent=count)
    sent: dict[str, bytes] = {}
    lettered: set[str] = set()
    for index in range(count):
        message = mutator.message(target, index)
        origin = message.origin()
        sent[origin] = _digest(message)
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            decoder.decode(message, out)
        except Exception as error:
            tally.raised.append(_failure(target, error, message))
        cpu = time.thread_time() - cpu_started
        tally.slow_count += cpu > slow_after
        if len(tally.slow) < keep_slow or cpu > tally.slow[-1][0]:
            size = f"{len(message.value or b''):,} bytes"
            slow = (cpu, time.perf_counter() - started, target.name, f"{origin} ({size})")
            tally.slow = sorted([*tally.slow, slow], reverse=True)[:keep_slow]
        for letter in out.dead_letters:
            where = letter.message.origin()
            if where in lettered or sent.get(where) != _digest(letter.message) or where == "a record":
                tally.not_exact.append(f"{target.name}: {where}")
            lettered.add(where)
            if letter.reason.startswith("internal error"):
                reason = letter.reason.split(";")[0][:120]
                tally.internal_reasons[f"{target.format}: {reason}"] = (
                    tally.internal_reasons.get(f"{target.format}: {reason}", 0) + 1
                )
        out.changes.clear()
        out.events.clear()
        out.dead_letters.clear()
    tally.metrics = out.metrics
    if out.metrics.unaccounted() or out.metrics.messages + len(tally.raised) != count:
        tally.unaccounted.append(f"{target.name}: sent {count}, raised {len(tally.raised)}, {out.metrics}")
    return tally


def _failure(target: Target, error: Exception, message: Message) -> Failure:
    from cdcflow.formats.errors import exception_text

    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if "/cdcflow/" in f.filename or "/formats/" in f.filename
    ]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}" if frames else "?"
    return Failure(
        target.name,
        target.format,
        type(error).__name__,
        exception_text(error, 200),
        where,
        message.value,
        message.key,
    )


def minimize(target: Target, failure: Failure, budget: int = 300) -> bytes | None:
    """A smaller value raising the same exception type with a fresh decoder (JSON values: keys and
    items removed, strings halved), else the value as it was."""
    value = failure.value
    if value is None or target.avro:
        return value

    def fails(candidate: bytes) -> bool:
        try:
            target.decoder().decode(
                Message(candidate, key=failure.key, topic="min", partition=0, offset=0), DecodeOutput()
            )
        except Exception as error:
            return type(error).__name__ == failure.error
        return False

    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    if not fails(dumps(document)):
        return value
    tries, progress = 0, True
    while progress and tries < budget:
        progress = False
        for holder, slot in list(_holders(document)):
            original = holder[slot]
            edits: list[Any] = [_REMOVED]
            if isinstance(original, str) and len(original) > 8:
                edits.append(original[: len(original) // 2])
            for edit in edits:
                tries += 1
                if edit is _REMOVED:
                    holder.pop(slot)
                else:
                    holder[slot] = edit
                if fails(dumps(document)):
                    progress = True
                    break
                if edit is _REMOVED and isinstance(holder, list):
                    holder.insert(slot, original)
                else:
                    holder[slot] = original
            if progress or tries >= budget:
                break
    return dumps(document)


_REMOVED = object()


def run(
    all_targets: list[Target], total: int, seed: int, *, big: int = 100_000, slow_after: float = 0.1
) -> Tally:
    """``total`` mutated messages spread evenly over the targets."""
    mutator = Mutator(seed, big=big)
    tally = Tally()
    each, extra = divmod(total, len(all_targets))
    for number, target in enumerate(all_targets):
        tally.add(run_target(target, each + (number < extra), mutator, slow_after=slow_after))
    return tally


def summary_lines(tally: Tally) -> list[str]:
    m = tally.metrics
    return [
        f"messages          {tally.sent:>9,}",
        f"  with changes    {m.changed_messages:>9,}  ({m.changes:,} changes)",
        f"  dead letters    {m.dead_letters:>9,}  ({m.internal_errors:,} internal errors)",
        f"  side outputs    {m.events:>9,}",
        f"  filtered        {m.filtered:>9,}",
        f"  tombstones      {m.tombstones:>9,}",
        f"  empty           {m.empty:>9,}",
        f"  raw exceptions  {len(tally.raised):>9,}",
    ]
