"""Every recorded input of the format golden tests, read with Spark and applied to a Delta table by
primary key, leaves the table its expected changelog folds to; and so does the bundled PostgreSQL
recording through the streaming ingest job.

The expected table is folded from the EXPECTED changelog (Flink's golden rows, or ours where we differ
from Flink), not from what Spark read; it is compared with the table as ``deltalake`` reads it and as
Spark reads the table's current files. The cases run on delta-rs; the Spark back end applies the same
batches of every case in ``test_spark_back_end_leaves_the_table_delta_rs_leaves``, the back-end
differential, whose two tables must hold the same rows and the fold (cases whose keys have one type
share a table there, each case's rows keyed apart by the column ``CASE``), and where Spark's Delta reader
reads every case's rows of the table delta-rs wrote (a Delta read is ~1.4 s of Spark jobs whatever the
table's size: once per shared table, not once per case).
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from itertools import combinations, zip_longest
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from backends import BACKENDS, delta_reader_rows, lake, table_backend
from delta_fold import (
    Line,
    batches,
    deltalake_rows,
    fold,
    keyed_problem,
    parse_line,
    rendered_rows,
    spark_rows,
)
from golden_cases import TESTDATA, GoldenCase
from pyspark.sql import SparkSession
from test_read_recorded import CASES, expected, reader

from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize
from cdcflow.connectors.lakehouse.delta.tables import TableBackend
from cdcflow.connectors.lakehouse.ingest import IngestConfig, ingest
from cdcflow.connectors.replay.dumps import read_messages
from cdcflow.core import RowKind
from cdcflow.formats import render_change, resolve_format

pytestmark = pytest.mark.integration

NO_KEY = {
    "flink-canal-data-filter-table-ignore-errors": (
        "two tables",
        "two tables in one changelog: every column is null in some row (product rows have no "
        "order_number, order rows no id), so no key is ever non-null",
    ),
    "paimon-canal-database-topic0-canal-data-1": (
        "duplicate rows",
        "+I[3, three] three times without a delete: the rows are duplicates, no column set identifies one",
    ),
    "paimon-debezium-table-schemaevolution-debezium-data-1-2-3-nullable-id": (
        "null before image",
        "the update's partial before image is null in every column but the one it changes "
        "(-U[null, ..., Shanghai])",
    ),
    "paimon-debezium-table-schemaevolution-debezium-data-3-nullable-id": (
        "null before image",
        "as data-1-2-3-nullable-id: -U[null, null, null, null, Shanghai]",
    ),
    "risingwave-canal-json-double-field-ignore-errors": (
        "updates change every column",
        "the updates change every column (-U[1, 2] +U[5, 6]), so no column set keys a -U to its +U",
    ),
}
"""Cases whose expected changelog no choice of primary key makes a keyed upsert stream."""

FORCE_MATERIALIZE = {
    "flink-debezium-data-schema-exclude",
    "flink-canal-data-with-init",
    "flink-maxwell-data",
    "flink-ogg-data",
    "paimon-debezium-table-schema-alltype-debezium-data-1",
    "paimon-canal-table-alltype-canal-data",
}
"""Cases applied a second time with materialize='force' (per-key state), which must not change the table."""


def error_of(case: GoldenCase) -> str | None:
    want = expected(case)
    return want[0].removeprefix("# error: ") if want and want[0].startswith("# error: ") else None


def primary_key(case: GoldenCase) -> tuple[str, ...]:
    """No golden schema declares a primary key: its first NOT NULL column, else its first column."""
    declared = [f.name for f in case.schema if not f.nullable]
    return (declared[0] if declared else case.schema.names[0],)


def expected_lines(case: GoldenCase, key: Sequence[str]) -> list[Line]:
    return [parse_line(text, case.schema, key) for text in expected(case) if not text.startswith("#")]


def skip_reason(case: GoldenCase) -> tuple[str, str] | None:
    """(short, full) reason a case is not applied: its read fails, or no key makes it a keyed stream."""
    error = error_of(case)
    if error is not None:
        return "read fails", f"the read fails: {error}"
    if case.case_id in NO_KEY:
        short, reason = NO_KEY[case.case_id]
        return f"no key: {short}", f"no primary key: {reason}"
    return None


def _params() -> list[object]:
    params = []
    for case in CASES:
        reason = skip_reason(case)
        if reason is None:
            params.append(pytest.param(case, id=case.case_id))
        else:
            short, full = reason
            params.append(
                pytest.param(case, id=f"{case.case_id} [skip: {short}]", marks=pytest.mark.skip(reason=full))
            )
    return params


_READ: dict[str, pa.Table] = {}
"""Each case's changelog as Spark read it, kept for the module's later tests of the same case."""


def read_case(spark: SparkSession, case: GoldenCase, tmp_path: Path) -> pa.Table:
    """The case's changelog, read with Spark in one batch read (once per case and test session)."""
    if case.case_id not in _READ:
        _READ[case.case_id] = (
            reader(spark, case, tmp_path / "dead").load(str(TESTDATA / case.input)).toArrow()
        )
    return _READ[case.case_id]


def apply_changelog(
    changelog: pa.Table,
    key: tuple[str, ...],
    target: Path | str,
    tmp_path: Path,
    *,
    force: bool,
    backend: TableBackend,
    state: str | None = None,
    count: int = 3,
) -> int:
    """Apply the changelog in ``count`` batches; returns the batches applied. ``target`` and ``state``
    (default: a folder of ``tmp_path``) may be object store URIs."""
    return apply_batches(
        batches(changelog, count), key, target, tmp_path, force=force, backend=backend, state=state
    )


def apply_batches(
    parts: Sequence[pa.Table],
    key: tuple[str, ...],
    target: Path | str,
    tmp_path: Path,
    *,
    force: bool,
    backend: TableBackend,
    state: str | None = None,
) -> int:
    options = ApplyOptions(
        key=key, upsert_key=key, materialize=Materialize.FORCE if force else Materialize.AUTO
    )
    assert options.materializes is force
    applier = DeltaChangeApplier(
        str(target),
        options,
        app_id="golden",
        state_path=(state or str(tmp_path / "state")) if force else None,
        backend=backend,
    )
    for batch_id, part in enumerate(parts, start=7):
        applied = applier.apply(part, batch_id)
        assert not applied.skipped and applied.changes == part.num_rows
        assert applied.unmatched_retractions == 0 or force
    return len(parts)


def test_no_key_cases_have_no_key_at_all() -> None:
    """The listed cases are exactly those the chosen key fails for, and no other column set works."""
    readable = [case for case in CASES if error_of(case) is None]
    failing = {
        case.case_id
        for case in readable
        if keyed_problem(expected_lines(case, primary_key(case))) is not None
    }
    assert failing == set(NO_KEY)
    for case in readable:
        if case.case_id not in NO_KEY:
            continue
        names = case.schema.names
        assert len(names) <= 10, "an exhaustive search over column sets needs a small schema"
        for size in range(1, len(names) + 1):
            for key in combinations(names, size):
                assert keyed_problem(expected_lines(case, key)) is not None, (case.case_id, key)


@pytest.mark.parametrize("case", _params())
def test_delta_table_is_the_fold_of_the_expected_changelog(
    spark: SparkSession, case: GoldenCase, tmp_path: Path
) -> None:
    key = primary_key(case)
    lines = expected_lines(case, key)
    assert keyed_problem(lines) is None
    want = fold(lines)
    target = tmp_path / "table"

    tables = table_backend("delta-rs", spark)

    changelog = read_case(spark, case, tmp_path)
    applied = apply_changelog(changelog, key, target, tmp_path, force=False, backend=tables)

    assert applied >= 2 or len(lines) < 3, "a changelog of 3+ changes is applied in 2+ batches"
    assert rendered_rows(deltalake_rows(str(target)), case.schema) == want
    assert rendered_rows(spark_rows(spark, str(target)), case.schema) == want

    if case.case_id in FORCE_MATERIALIZE:
        forced = tmp_path / "forced"
        apply_changelog(changelog, key, forced, tmp_path / "force", force=True, backend=tables)
        assert rendered_rows(deltalake_rows(str(forced)), case.schema) == want


CASE = "__golden_case"
"""The column that tells the cases of a shared table apart (a key column)."""
KEY = "__golden_key"
"""The shared table's other key column: each case's own key column, renamed."""
SCHEMAS_PER_TABLE = 11
"""Schemas sharing one table in the back-end differential: a Delta table per schema cost each back end
its fixed per-merge time 27 times; a table of every schema would be hundreds of columns wide."""


def _shared_tables() -> list[object]:
    """The applied cases in tables of up to ``SCHEMAS_PER_TABLE`` schemas whose key has one type, the
    schemas of materialized cases first (a table holding one is applied a second time, materialized)."""
    by_type: dict[str, dict[str, list[GoldenCase]]] = {}
    for case in CASES:
        if skip_reason(case) is None:
            key_type = next(f.type for f in case.schema if f.name == primary_key(case)[0])
            by_type.setdefault(key_type.kind.value, {}).setdefault(case.schema_ddl, []).append(case)
    params = []
    for key_type, schemas in by_type.items():
        groups = sorted(
            schemas.values(), key=lambda group: not any(c.case_id in FORCE_MATERIALIZE for c in group)
        )
        for start in range(0, len(groups), SCHEMAS_PER_TABLE):
            cases = [case for group in groups[start : start + SCHEMAS_PER_TABLE] for case in group]
            table = f"{key_type} key, table {start // SCHEMAS_PER_TABLE + 1}"
            params.append(pytest.param(cases, id=f"{table}: {cases[0].case_id} and {len(cases) - 1} more"))
    return params


def _column(case: GoldenCase, schemas: Sequence[str], name: str) -> str:
    """The shared table's name for a column of ``case``: its key is ``KEY``, every other column is
    prefixed by the number of its schema (cases of one schema share columns)."""
    return KEY if name == primary_key(case)[0] else f"s{schemas.index(case.schema_ddl)}_{name}"


def _shared(changelog: pa.Table, case: GoldenCase, schemas: Sequence[str]) -> pa.Table:
    """A case's changelog with the shared table's column names; the columns other schemas leave null
    are nullable (the key stays as it was)."""
    data = set(case.schema.names)
    fields = [
        pa.field(_column(case, schemas, f.name), f.type, f.nullable or f.name != primary_key(case)[0])
        if f.name in data
        else f
        for f in changelog.schema
    ]
    return pa.Table.from_arrays(changelog.columns, schema=pa.schema(fields))


def group_batches(changelogs: Mapping[str, pa.Table], count: int) -> list[pa.Table]:
    """Each case's changelog cut into ``count`` batches and tagged with its case id in ``CASE``; batch i
    of the group holds batch i of every case (whose keys never meet: ``CASE`` is part of the key)."""
    cut = [
        [
            part.append_column(CASE, pa.array([case_id] * part.num_rows, pa.string()))
            for part in batches(table, count)
        ]
        for case_id, table in changelogs.items()
    ]
    return [
        pa.concat_tables([part for part in parts if part is not None], promote_options="permissive")
        for parts in zip_longest(*cut)
    ]


def case_rows(
    rows: Iterable[Mapping[str, Any]], cases: Sequence[GoldenCase], schemas: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """The shared table's rows of each case, with the case's own column names."""
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    names = {case.case_id: {n: _column(case, schemas, n) for n in case.schema.names} for case in cases}
    for row in rows:
        by_case[row[CASE]].append({name: row[column] for name, column in names[row[CASE]].items()})
    return by_case


def rendered_by_case(
    rows: Iterable[Mapping[str, Any]], cases: Sequence[GoldenCase], schemas: Sequence[str]
) -> dict[str, list[str]]:
    """Each case's rows of a shared table, rendered as its expected changelog's fold is."""
    by_case = case_rows(rows, cases, schemas)
    return {case.case_id: rendered_rows(by_case[case.case_id], case.schema) for case in cases}


@pytest.mark.parametrize("cases", _shared_tables())
def test_spark_back_end_leaves_the_table_delta_rs_leaves(
    spark: SparkSession, cases: list[GoldenCase], tmp_path: Path
) -> None:
    """The back-end differential: the same batches through delta-rs and through Delta Lake's MERGE on
    Spark leave the same rows, and each case's rows are the fold of its expected changelog (also when
    materialized), also as Spark's Delta reader reads delta-rs's table. Cases whose keys have one type
    share a table (up to ``SCHEMAS_PER_TABLE`` schemas): the key is ``CASE`` and the case's key column
    as ``KEY``, its other columns are named apart by schema. Two batches: the second merges into the
    rows the first wrote (the delta-rs run above takes three)."""
    schemas = list(dict.fromkeys(case.schema_ddl for case in cases))
    want = {case.case_id: fold(expected_lines(case, primary_key(case))) for case in cases}
    changelogs = {case.case_id: _shared(read_case(spark, case, tmp_path), case, schemas) for case in cases}
    parts = group_batches(changelogs, 2)
    materialized = any(case.case_id in FORCE_MATERIALIZE for case in cases)
    for force in (False, True) if materialized else (False,):
        tables = {}
        targets = {backend: tmp_path / f"{backend}-{force}" for backend in BACKENDS}
        for backend, target in targets.items():
            apply_batches(
                parts,
                (CASE, KEY),
                target,
                tmp_path / target.name,
                force=force,
                backend=table_backend(backend, spark),
            )
            tables[backend] = rendered_by_case(deltalake_rows(str(target)), cases, schemas)
        on_spark = rendered_by_case(delta_reader_rows(spark, str(targets["delta-rs"])), cases, schemas)
        assert tables["spark"] == tables["delta-rs"], f"the back ends differ (materialize={force})"
        assert tables["spark"] == want
        assert on_spark == want, (
            f"Spark's Delta reader reads delta-rs's table otherwise (materialize={force})"
        )


S3_CASE = "paimon-debezium-table-schema-alltype-debezium-data-1"
"""The materialized case of every type that runs again on S3, on each back end (what differs on S3 is
where the table and the key state are, not the case; S3A on moto is slow)."""


def _s3_params() -> list[object]:
    case = next(case for case in CASES if case.case_id == S3_CASE)
    return [pytest.param(case, backend, id=f"{S3_CASE}-{backend}") for backend in BACKENDS]


@pytest.mark.parametrize(("case", "backend"), _s3_params())
def test_delta_table_on_s3_is_the_fold_of_the_expected_changelog(
    spark: SparkSession, case: GoldenCase, tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A materialized case again with the table and the key state on the S3 test server."""
    on_s3 = lake("s3", tmp_path, request)
    options = on_s3.storage_options
    key = primary_key(case)
    want = fold(expected_lines(case, key))
    tables = table_backend(backend, spark, options)
    changelog = read_case(spark, case, tmp_path)
    for name, force in (("table", False), ("forced", True)):
        target = on_s3.path(name)
        state = on_s3.path(f"checkpoint-{name}/state", "s3a")
        apply_changelog(changelog, key, target, tmp_path / name, force=force, backend=tables, state=state)
        assert rendered_rows(deltalake_rows(target, options), case.schema) == want
        assert rendered_rows(spark_rows(spark, target, options), case.schema) == want
        assert rendered_rows(delta_reader_rows(spark, target, options), case.schema) == want
    assert on_s3.bucket is not None and on_s3.bucket.keys("checkpoint-forced/state/_delta_log/")
    assert not (tmp_path / "forced" / "state").exists(), "the key state went to a local folder"


def test_the_materialized_cases_are_applied_cases() -> None:
    applied = {case.case_id for case in CASES if skip_reason(case) is None}
    assert FORCE_MATERIALIZE <= applied
    assert len(applied) == 63 and len(CASES) == 75, "a case appeared or disappeared: review the lists"


# --- the bundled PostgreSQL recording through the ingest job ----------------------------------------

DUMP = str(resources.files("cdcflow.examples").joinpath("postgres-debezium.dump.jsonl"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("max_bytes", "batches_at_least"), [(None, 1), ("100000", 3)], ids=["one batch", "several batches"]
)
def test_ingest_of_the_postgres_recording_leaves_the_fold_of_its_changelog(
    spark: SparkSession, tmp_path: Path, max_bytes: str | None, batches_at_least: int, backend: str
) -> None:
    """On object storage: test_postgres_workload.py (the recorded workload with the table, the key state
    and Spark's checkpoint on S3, on each back end)."""
    # No golden file here: the expected changelog is the pure-Python decoder's (the format layer,
    # tested on its own in tests/formats), computed without Spark or the sink.
    decoder = resolve_format("debezium-json").create_decoder({"schema-include": "true"})
    changes = decoder.decode_all(list(read_messages(DUMP))).changes
    schema = decoder.schema
    lines = [Line(c.kind.value, (str(c.row["id"]),), render_change(c, schema)[2:]) for c in changes]
    assert keyed_problem(lines) is None
    want = fold(lines)
    assert sorted(int(row[1 : row.index(",")]) for row in want) == [1, 4, 10, 20]

    target = str(tmp_path / "table")
    config = IngestConfig(
        format="debezium-json",
        key=("id",),
        target=target,
        checkpoint=str(tmp_path / "checkpoint"),
        path=DUMP,
        options={"schema-include": "true", **({"maxBytesPerTrigger": max_bytes} if max_bytes else {})},
        backend=backend,  # type: ignore[arg-type]
    )
    assert config.resolved_sequence() == "source_sequence"
    summary = ingest(config, spark=spark, out=io.StringIO())

    assert summary.batches >= batches_at_least
    # ingest reads updates as upserts (changelog-mode=upsert): an update is one change, its +U row.
    assert summary.progress.totals.changes == sum(1 for c in changes if c.kind is not RowKind.UPDATE_BEFORE)
    assert summary.progress.totals.late == 0
    assert rendered_rows(deltalake_rows(target), schema) == want
    assert rendered_rows(spark_rows(spark, target), schema) == want
    assert rendered_rows(delta_reader_rows(spark, target), schema) == want
