"""The exactly-once identity of a Delta sink: its application id, tied to the checkpoint it runs from.

Delta remembers the last batch id each application id committed; Spark numbers batches from its
checkpoint. An application id reused with a new checkpoint would find batches 0, 1, ... "already
applied" and skip them, and a checkpoint continued under another id would apply its batches under
an id with its own history. So the id is recorded in ``<checkpoint>/cdcflow-app-id`` on first use and
every start checks that the two still belong together. The checkpoint may be on an object store
(S3, ADLS, GCS): the marker is read and written through :class:`~.storage.Storage`.
"""

from __future__ import annotations

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, Storage, join
from cdcflow.connectors.lakehouse.delta.tables import applied_version, open_table
from cdcflow.formats.redact import redact

MARKER = "cdcflow-app-id"


def recorded(checkpoint: str, storage: Storage = LOCAL) -> str | None:
    """The application id recorded in ``checkpoint``, None when none is."""
    text = storage.read_text(join(checkpoint, MARKER))
    return (text or "").strip() or None


def claim(
    checkpoint: str,
    app_id: str,
    target: str,
    state_path: str | None,
    *,
    record: bool,
    chosen: bool = True,
    storage: Storage = LOCAL,
) -> None:
    """Check that ``app_id`` belongs to ``checkpoint`` (and record it there when ``record``).

    Refuses a checkpoint recorded with another id, and a new checkpoint (no batch committed) whose
    ``chosen`` id (not derived from the checkpoint's query id) already committed batches to the target
    or the key state: those batches would be skipped. ``storage`` reaches the checkpoint and the tables
    when they are on an object store.
    """
    known = recorded(checkpoint, storage)
    if known is not None:
        if known != app_id:
            raise ConnectorOptionError(
                f"the checkpoint {redact(checkpoint)} applies to {redact(target)} as application id "
                f"{known!r}, not {app_id!r}; continue it with app_id {known!r} (--app-id), or start a new "
                "checkpoint for the new id (which applies the whole input again)"
            )
        return
    if chosen and not _has_committed_batches(checkpoint, storage):
        applied = applied_version(open_table(target, storage), app_id)
        if state_path is not None:
            applied = max(applied, applied_version(open_table(state_path, storage), app_id))
        if applied >= 0:
            raise ConnectorOptionError(
                f"application id {app_id!r} already applied batches up to {applied} to {redact(target)}, but "
                f"the checkpoint {redact(checkpoint)} is new: its batch ids start again at 0 and would be "
                "skipped as already applied. To apply the input again, choose a new app id (--app-id, "
                "app_id=...); to continue where that id stopped, restore the checkpoint it ran with"
            )
    if record:
        storage.write_text(join(checkpoint, MARKER), app_id + "\n")


def _has_committed_batches(checkpoint: str, storage: Storage) -> bool:
    """Whether Spark committed a batch in ``checkpoint`` (its ``commits`` log names batch ids)."""
    return any(name.isdigit() for name in storage.names(join(checkpoint, "commits")))
