"""Micro-batches Spark has committed whose Delta commits may not have landed yet: a write-ahead log.

The ingest job applies micro-batch N in a background thread while Spark decodes N+1
(:class:`.delta_sink.DeltaSink` with ``pipeline=True``). Spark records N in its commit log as soon as
``foreachBatch`` returns, before N reaches the table; so each batch's changes are written here first,
as one Arrow IPC file under ``<checkpoint>/cdcflow-pending/``, and removed once the table has them.
A driver that dies in between leaves the file: the next run applies it before its first batch. A
file appears whole or not at all (written aside and renamed locally; one PUT on an object store).
"""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.ipc as ipc

from cdcflow.connectors.lakehouse.storage import Storage, is_remote, join

PENDING_DIR = "cdcflow-pending"
_SUFFIX = ".arrow"


class PendingBatches:
    """The pending micro-batches of one checkpoint, by batch id."""

    def __init__(self, checkpoint: str, storage: Storage) -> None:
        self.directory = join(checkpoint, PENDING_DIR)
        self.storage = storage

    def _uri(self, batch_id: int) -> str:
        return join(self.directory, f"{batch_id}{_SUFFIX}")

    def write(self, batch_id: int, table: pa.Table) -> None:
        fs, path = self.storage.filesystem(self._uri(batch_id))
        written = path
        if not is_remote(self.directory):
            fs.create_dir(os.path.dirname(path), recursive=True)
            written = f"{path}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(written) as sink, ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
        if written != path:
            fs.move(written, path)

    def read(self, batch_id: int) -> pa.Table:
        fs, path = self.storage.filesystem(self._uri(batch_id))
        with fs.open_input_file(path) as source:
            return ipc.open_file(source).read_all()

    def ids(self) -> list[int]:
        """The pending batch ids, oldest first (a write cut short leaves only a ``.tmp`` file)."""
        names = self.storage.names(self.directory)
        return sorted(int(name[: -len(_SUFFIX)]) for name in names if _is_batch(name))

    def discard_partial(self) -> None:
        """Remove what writes cut short left (never a batch Spark committed: its write had finished)."""
        fs, path = self.storage.filesystem(self.directory)
        for name in self.storage.names(self.directory):
            if name.endswith(".tmp"):
                fs.delete_file(f"{path}/{name}")

    def remove(self, batch_id: int) -> None:
        fs, path = self.storage.filesystem(self._uri(batch_id))
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            pass


def _is_batch(name: str) -> bool:
    return name.endswith(_SUFFIX) and name[: -len(_SUFFIX)].isdigit()
