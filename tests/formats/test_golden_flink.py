"""Golden tests: every recorded file Flink 2.3 decodes gives the same changelog here.

The golden files (``golden/*.golden``) hold Flink's output, written by ``scripts/flink_golden.py``
with PyFlink 2.3. Where Flink fails or is wrong, :data:`KNOWN_DIFFERENCES` says why, and
``golden/<case>.cdcflow`` holds what we give instead: rows, dead letters (``# dead-letter:``) or the
error (``# error:``). Regenerate those with ``python tests/formats/test_golden_flink.py --write``
and review the diff.
"""

from __future__ import annotations

import sys

import pytest
from golden_cases import GOLDEN, GoldenCase, all_cases

from cdcflow.formats import DecodeError, render_change, resolve_format

CASES = all_cases()

_FLINK_NULLS_BAD_FIELDS = (
    "with ignore-parse-errors Flink sets a field it cannot convert to NULL and keeps the row (silently "
    "corrupt data) or drops the whole message; we send the message to the dead-letter output with its bytes"
)
_FLINK_NULLS_WE_READ = (
    "with ignore-parse-errors Flink sets the fields it cannot read to NULL and keeps the row; we read them"
)
KNOWN_DIFFERENCES = {
    "flink-canal-data-filter-table": "both fail on 'A101' in the INT id at line 16; ours names the field",
    "flink-canal-data-filter-table-ignore-errors": _FLINK_NULLS_BAD_FIELDS,
    "flink-canal-data-with-init": "Flink rejects the INIT message; we route it to the side output",
    "flink-canal-data-with-init-ignore-errors": "Flink drops the INIT message silently; we route it to the "
    "side output",
    "flink-debezium-postgres-data-replica-identity": "both fail on the update without a before image; our "
    "error names the line and field and says how to fix it",
    "flink-debezium-postgres-data-replica-identity-ignore-errors": "Flink drops the 5 events without a "
    "before image silently; we dead-letter them (read them with changelog-mode=upsert to keep them)",
    "paimon-canal-table-alltype-canal-data": "Flink cannot read MySQL TIMESTAMP text as TIMESTAMP_LTZ and "
    "reads binary as base64; we read both as Canal writes them",
    "paimon-canal-table-alltype-canal-data-ignore-errors": _FLINK_NULLS_WE_READ,
    "paimon-canal-table-event-insert-raw": "the raw file starts with a license comment: not JSON, for both",
    "paimon-canal-table-event-insert-raw-ignore-errors": "Flink skips the license lines silently; we "
    "dead-letter each with its line number",
    "paimon-canal-table-event-insert-update-delete-row": "Flink reads Canal's binary text as base64 and "
    "fails; Canal writes binary as ISO-8859-1 text, which we read",
    "paimon-canal-table-event-insert-update-delete-row-ignore-errors": _FLINK_NULLS_WE_READ,
    "paimon-canal-table-event-row": "Flink reads Canal's binary text as base64 and fails; we read ISO-8859-1",
    "paimon-canal-table-event-row-ignore-errors": _FLINK_NULLS_WE_READ,
    "paimon-debezium-table-schema-alltype-debezium-data-1": "Flink ignores the schema block and cannot read "
    "Debezium's epoch dates and times; we decode the logical types",
    "paimon-debezium-table-schema-alltype-debezium-data-1-ignore-errors": _FLINK_NULLS_WE_READ,
    "paimon-debezium-table-schema-alltype-debezium-data-1-physical-iso": "Flink reads ZonedTimestamp text "
    "only with ISO-8601; we read it with either standard",
    "paimon-debezium-table-schema-schemaevolution-debezium-data-with-delete": "the event has no top-level op "
    "(not a Debezium envelope): Flink fails with a NullPointerException, we name the field",
    "paimon-debezium-table-schema-schemaevolution-debezium-data-with-delete-ignore-errors": "Flink drops the "
    "event silently; we dead-letter it",
    "paimon-debezium-table-schemaevolution-debezium-data-1-2-3": "the partial before image has a NULL id: "
    "Flink fails at its NOT NULL check after parsing, we fail at the record naming before.id",
    "paimon-debezium-table-schemaevolution-debezium-data-3": "as debezium-data-1-2-3",
    "risingwave-canal-json-double-field": "'a' in an INT column: both fail; ours names data[2].v1",
    "risingwave-canal-json-double-field-ignore-errors": _FLINK_NULLS_BAD_FIELDS,
    "risingwave-debezium-timestamp": "Flink cannot read Debezium's epoch timestamp; we decode the schema",
    "risingwave-debezium-timestamp-ignore-errors": _FLINK_NULLS_WE_READ,
    "risingwave-maxwell-json-boolean": "Flink's Boolean.parseBoolean reads MySQL's 1 as false; we read it "
    "as true",
}


def ours(case: GoldenCase) -> list[str]:
    """Our result for a case, in the golden-file line format."""
    decoder = resolve_format(case.format).create_decoder(case.options, case.schema)
    try:
        out = decoder.decode_all(case.messages())
    except DecodeError as error:
        return [f"# error: {error}"]
    lines = [render_change(change, decoder.schema) for change in out.changes]
    lines += [f"# side-output: {e.message.origin()} {e.kind}" for e in out.events]
    lines += [
        f"# dead-letter: {d.message.origin()} ({d.field or 'message'}): {d.reason}" for d in out.dead_letters
    ]
    return lines


def expected_ours(case: GoldenCase) -> list[str]:
    path = GOLDEN / f"{case.case_id}.cdcflow"
    return [line for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("## ")]


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.case_id not in KNOWN_DIFFERENCES], ids=lambda c: c.case_id
)
def test_same_changelog_as_flink(case: GoldenCase) -> None:
    assert case.flink_error is None
    assert [line for line in ours(case) if not line.startswith("# side-output")] == case.rows


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.case_id in KNOWN_DIFFERENCES], ids=lambda c: c.case_id
)
def test_known_difference_from_flink(case: GoldenCase) -> None:
    result = ours(case)
    assert result == expected_ours(case)
    assert result != case.rows, "no longer differs from Flink: remove it from KNOWN_DIFFERENCES"


def test_every_known_difference_is_a_case() -> None:
    assert set(KNOWN_DIFFERENCES) <= {c.case_id for c in CASES}


def _write() -> None:
    for case in CASES:
        if case.case_id in KNOWN_DIFFERENCES:
            text = [f"## {case.case_id}: {KNOWN_DIFFERENCES[case.case_id]}", *ours(case)]
            (GOLDEN / f"{case.case_id}.cdcflow").write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__" and "--write" in sys.argv:
    _write()
