"""The exactly-once identity of a Delta sink: its application id, tied to the checkpoint it runs from.

Delta remembers the last batch id each application id committed; Spark numbers batches from its
checkpoint. An application id reused with a new checkpoint would find batches 0, 1, ... "already
applied" and skip them, and a checkpoint continued under another id would apply its batches under
an id with its own history. So the id is recorded in ``<checkpoint>/cdcflow-app-id`` on first use and
every start checks that the two still belong together.
"""

from __future__ import annotations

import os

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta_io import applied_version, open_table
from cdcflow.formats.redact import redact

MARKER = "cdcflow-app-id"


def local_checkpoint(checkpoint: str) -> str:
    if "://" in checkpoint and not checkpoint.startswith("file://"):
        raise ConnectorOptionError(
            f"the Delta sink keeps its application id in the checkpoint, and {redact(checkpoint)!r} is not "
            "a local or mounted path: use a local or mounted checkpointLocation"
        )
    return checkpoint.removeprefix("file://")


def recorded(checkpoint: str) -> str | None:
    """The application id recorded in ``checkpoint``, None when none is."""
    try:
        with open(os.path.join(local_checkpoint(checkpoint), MARKER), encoding="utf-8") as handle:
            return handle.read().strip() or None
    except FileNotFoundError:
        return None


def claim(
    checkpoint: str, app_id: str, target: str, state_path: str | None, *, record: bool, chosen: bool = True
) -> None:
    """Check that ``app_id`` belongs to ``checkpoint`` (and record it there when ``record``).

    Refuses a checkpoint recorded with another id, and a new checkpoint (no batch committed) whose
    ``chosen`` id (not derived from the checkpoint's query id) already committed batches to the target
    or the key state: those batches would be skipped.
    """
    known = recorded(checkpoint)
    if known is not None:
        if known != app_id:
            raise ConnectorOptionError(
                f"the checkpoint {checkpoint} applies to {redact(target)} as application id {known!r}, not "
                f"{app_id!r}; continue it with app_id {known!r} (--app-id), or start a new checkpoint for "
                "the new id (which applies the whole input again)"
            )
        return
    if chosen and not _has_committed_batches(checkpoint):
        applied = applied_version(open_table(target), app_id)
        if state_path is not None:
            applied = max(applied, applied_version(open_table(state_path), app_id))
        if applied >= 0:
            raise ConnectorOptionError(
                f"application id {app_id!r} already applied batches up to {applied} to {redact(target)}, but "
                f"the checkpoint {checkpoint} is new: its batch ids start again at 0 and would be skipped as "
                "already applied. To apply the input again, choose a new app id (--app-id, app_id=...); to "
                "continue where that id stopped, restore the checkpoint it ran with"
            )
    if record:
        path = local_checkpoint(checkpoint)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, MARKER), "w", encoding="utf-8") as handle:
            handle.write(app_id + "\n")


def _has_committed_batches(checkpoint: str) -> bool:
    """Whether Spark committed a batch in ``checkpoint`` (its ``commits`` log names batch ids)."""
    commits = os.path.join(local_checkpoint(checkpoint), "commits")
    return os.path.isdir(commits) and any(name.isdigit() for name in os.listdir(commits))
