"""``ingest --commit-group NAME``: the job's lag where Kafka's tools look.

Once a micro-batch is in the table, its end offsets (from Spark's offset log in the checkpoint) are
committed to the consumer group NAME, so that ``kafka-consumer-groups --describe --group NAME`` and lag
monitors such as Burrow show how far the job is behind. Nothing reads them back: the checkpoint decides
where the job goes on. (Spark tells a source that a batch is done only when it plans the next one, so
the source's own ``commit`` would leave the group a batch behind, and the last batch of an
``available-now`` run uncommitted.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cdcflow.connectors.kafka.admin import GroupCommits
from cdcflow.connectors.kafka.options import KafkaOptions, Offsets, offsets_from_json
from cdcflow.connectors.lakehouse.delta.storage import Storage, join

if TYPE_CHECKING:
    from cdcflow.connectors.lakehouse.delta.result import BatchApplied

OnBatch = Callable[["BatchApplied"], None]


def committing(
    group: str,
    checkpoint: str,
    storage: Storage,
    source_options: Mapping[str, str],
    on_batch: OnBatch | None,
) -> OnBatch:
    """``on_batch``, after committing each applied batch's end offsets to consumer group ``group``."""
    commits = GroupCommits(KafkaOptions.parse(source_options), group)

    def commit(applied: BatchApplied) -> None:
        offsets = batch_end(storage, checkpoint, applied.batch_id)
        if offsets:
            commits.commit(offsets)
        if on_batch is not None:
            on_batch(applied)

    return commit


def batch_end(storage: Storage, checkpoint: str, batch_id: int) -> Offsets | None:
    """Where micro-batch ``batch_id`` ends in each Kafka partition: the last line of Spark's offset log
    entry (None when it is not there or not Kafka offsets)."""
    text = storage.read_text(join(checkpoint, "offsets", str(batch_id)))
    if not text:
        return None
    try:
        return offsets_from_json(json.loads(text.splitlines()[-1]))
    except ValueError:
        return None
