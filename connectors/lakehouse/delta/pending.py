"""Micro-batches Spark has committed whose Delta commits may not have landed yet: a write-ahead log.

The ingest job applies micro-batch N in a background thread while Spark decodes N+1
(:class:`cdcflow.connectors.lakehouse.sink.DeltaSink` with ``pipeline=True``). Spark records N in its
commit log as soon as ``foreachBatch`` returns, before N reaches the table; so each batch's changes are
written here first, as one Arrow IPC file ``<checkpoint>/cdcflow-pending/<N>.arrow`` (or, when the
source handed the rows over as Arrow files on the same disk, those files moved into the folder ``<N>``),
and removed once the table has them. A driver that dies in between leaves them: the next run applies
them before its first batch. A batch appears whole or not at all (written or gathered aside and renamed
locally; one PUT on an object store).
"""

from __future__ import annotations

import os
import shutil
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from cdcflow.connectors.lakehouse.delta.storage import Storage, is_remote, join

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

    def adopt(self, batch_id: int, files: list[str]) -> None:
        """Make the Arrow files ``files`` (local, on the checkpoint's disk, in row order) the pending
        batch ``batch_id``: moved, not copied."""
        _, base = self.storage.filesystem(self.directory)
        folder = os.path.join(base, str(batch_id))
        partial = f"{folder}.{uuid.uuid4().hex}.tmp"
        os.makedirs(partial)
        for index, file in enumerate(files):
            os.replace(file, os.path.join(partial, f"{index:06d}{_SUFFIX}"))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)

    def read(self, batch_id: int) -> pa.Table:
        fs, path = self.storage.filesystem(self._uri(batch_id))
        folder = path[: -len(_SUFFIX)]
        if not is_remote(self.directory) and os.path.isdir(folder):
            files = sorted(os.path.join(folder, name) for name in os.listdir(folder))
            return pa.concat_tables(_read(fs, file) for file in files)
        return _read(fs, path)

    def ids(self) -> list[int]:
        """The pending batch ids, oldest first (a write cut short leaves only a ``.tmp`` entry)."""
        names = self.storage.names(self.directory)
        return sorted(
            {int(name.removesuffix(_SUFFIX)) for name in names if name.removesuffix(_SUFFIX).isdigit()}
        )

    def discard_partial(self) -> None:
        """Remove what writes cut short left (never a batch Spark committed: its write had finished)."""
        fs, path = self.storage.filesystem(self.directory)
        for name in self.storage.names(self.directory):
            if name.endswith(".tmp"):
                _delete(fs, f"{path}/{name}")

    def remove(self, batch_id: int) -> None:
        fs, path = self.storage.filesystem(self._uri(batch_id))
        _delete(fs, path)
        if not is_remote(self.directory):
            _delete(fs, path[: -len(_SUFFIX)])


def _read(fs: pafs.FileSystem, path: str) -> pa.Table:
    with fs.open_input_file(path) as source:
        return ipc.open_file(source).read_all()


def _delete(fs: pafs.FileSystem, path: str) -> None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)
