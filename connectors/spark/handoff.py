"""Decoded rows handed from executors to the driver as Arrow files, past Spark's row conversion.

With the source option ``handoffPath`` each input range's decoded changelog goes to one Arrow IPC
file in that directory, and the range's task yields one row naming it (:data:`FILE_COLUMN`, with
:data:`ROWS_COLUMN`). The driver reads the files of a micro-batch straight into one Arrow table: the
table ``toArrow`` would give, without the executors' Arrow → row conversion and the driver's
row → Arrow one, which cost as much CPU as the decoding. The directory must be local to the driver
and every executor (a local master); ``cdcflow ingest`` sets it in its checkpoint when that holds.
The changelog's Spark schema rides in the metadata of the DataFrame's first column
(:data:`CHANGELOG_KEY`), so the driver knows it without planning the read again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.ipc as ipc

from cdcflow.connectors.spark.accounting import attempt_suffix

FILE_COLUMN = "handoff_file"
ROWS_COLUMN = "handoff_rows"
CHANGELOG_KEY = "cdcflow.changelog"
"""Metadata key, on the Spark field :data:`FILE_COLUMN`, of the changelog's Spark schema (JSON)."""


def write(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, directory: str, name: str, row_schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Write ``batches`` (cast to ``schema``) to ``directory/name.arrow``; yield its one handoff row, of
    ``row_schema`` (none when the range decoded to no rows). A retried task replaces the file whole."""
    path = os.path.join(directory, f"{name}.arrow")
    partial = f"{path}.{attempt_suffix()}.tmp"
    rows = 0
    writer: ipc.RecordBatchFileWriter | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                os.makedirs(directory, exist_ok=True)
                writer = ipc.new_file(partial, schema)
            writer.write_batch(batch if batch.schema == schema else batch.cast(schema))
            rows += batch.num_rows
    except BaseException:
        if writer is not None:
            writer.close()
            os.remove(partial)
        raise
    if writer is None:
        return
    writer.close()
    os.replace(partial, path)
    yield pa.RecordBatch.from_arrays([pa.array([path]), pa.array([rows], pa.int64())], schema=row_schema)


def read(paths: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of the handoff files ``paths``, in order, as one table of ``schema``."""
    tables = []
    for path in paths:
        with pa.OSFile(path, "rb") as source:
            tables.append(ipc.open_file(source).read_all())
    return pa.concat_tables(tables) if tables else schema.empty_table()


def remove(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def clear(directory: str) -> None:
    """Remove what earlier runs left (ranges decoded for a batch that never ran to its end)."""
    if os.path.isdir(directory):
        remove(os.path.join(directory, name) for name in os.listdir(directory))


def is_handoff(columns: Sequence[str]) -> bool:
    return list(columns) == [FILE_COLUMN, ROWS_COLUMN]
