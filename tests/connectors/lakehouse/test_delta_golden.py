"""Every recorded input of the format golden tests, read with Spark and applied to a Delta table by
primary key, leaves the table its expected changelog folds to; and so does the bundled PostgreSQL
recording through the streaming ingest job.

The expected table is folded from the EXPECTED changelog (Flink's golden rows, or ours where we differ
from Flink), not from what Spark read; it is compared with the table as ``deltalake`` reads it and as
Spark reads the table's current files. The cases run on delta-rs; the Spark back end applies the same
batches of every case in ``test_spark_back_end_leaves_the_table_delta_rs_leaves``, the back-end
differential, whose two tables must hold the same rows and the fold (the cases of one schema share a
table there, each case's rows keyed apart by the column ``CASE``).
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
    assert rendered_rows(delta_reader_rows(spark, str(target)), case.schema) == want

    if case.case_id in FORCE_MATERIALIZE:
        forced = tmp_path / "forced"
        apply_changelog(changelog, key, forced, tmp_path / "force", force=True, backend=tables)
        assert rendered_rows(deltalake_rows(str(forced)), case.schema) == want
        assert rendered_rows(delta_reader_rows(spark, str(forced)), case.schema) == want


CASE = "__golden_case"
"""The column that tells the cases of a schema group apart in their shared table (a key column)."""


def _schema_groups() -> list[object]:
    """The applied cases grouped by schema and key: one table per group in the back-end differential."""
    groups: dict[tuple[str, tuple[str, ...]], list[GoldenCase]] = {}
    for case in CASES:
        if skip_reason(case) is None:
            groups.setdefault((str(case.schema), primary_key(case)), []).append(case)
    return [
        pytest.param(cases, id=cases[0].case_id + (f" and {len(cases) - 1} more" if len(cases) > 1 else ""))
        for cases in groups.values()
    ]


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


def rows_by_case(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_case: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_case[row[CASE]].append({name: value for name, value in row.items() if name != CASE})
    return by_case


@pytest.mark.parametrize("cases", _schema_groups())
def test_spark_back_end_leaves_the_table_delta_rs_leaves(
    spark: SparkSession, cases: list[GoldenCase], tmp_path: Path
) -> None:
    """The back-end differential: the same batches through delta-rs and through Delta Lake's MERGE on
    Spark leave the same rows, and each case's rows are the fold of its expected changelog (also when
    materialized). The cases of one schema share a table, each case's rows told apart by ``CASE`` in the
    key; two batches: the second merges into the rows the first wrote (the delta-rs run above takes three)."""
    key = primary_key(cases[0])
    want = {case.case_id: fold(expected_lines(case, key)) for case in cases}
    parts = group_batches({case.case_id: read_case(spark, case, tmp_path) for case in cases}, 2)
    materialized = any(case.case_id in FORCE_MATERIALIZE for case in cases)
    for force in (False, True) if materialized else (False,):
        tables = {}
        for backend in BACKENDS:
            target = tmp_path / f"{backend}-{force}"
            apply_batches(
                parts,
                (CASE, *key),
                target,
                tmp_path / target.name,
                force=force,
                backend=table_backend(backend, spark),
            )
            by_case = rows_by_case(deltalake_rows(str(target)))
            tables[backend] = {
                case.case_id: rendered_rows(by_case[case.case_id], case.schema) for case in cases
            }
        assert tables["spark"] == tables["delta-rs"], f"the back ends differ (materialize={force})"
        assert tables["spark"] == want


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
