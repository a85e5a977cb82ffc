"""``ingest --mode scd2``: each micro-batch of a source's changelog kept as SCD type 2 history.

Each row of the table is a version of a key: its columns, ``__START_AT`` (the time of the change that
opened it) and ``__END_AT`` (of the change that ended it; NULL while it holds), the names Spark's
Declarative Pipelines give an AUTO CDC SCD2 table. :class:`.history.DeltaHistoryWriter` writes them,
one merge per batch carrying the batch's application transaction. What a source sends besides rows is
resolved here, on the batch in time order:

- an unavailable value (Debezium's unchanged TOAST placeholder) takes the key's previous version's
  value (of this batch, else the table's open version), the create of a primary-key change the old
  key's;
- a TRUNCATE ends every open version at its time; a change from before it that arrives in a later
  batch (another partition) ends there too;
- the create of a primary-key change whose old key's last change is still to come (another partition,
  a later batch) claims that key's value: the versions it and its key's later changes open are
  patched once the old key's delete arrives;
- other control events are counted and skipped.

The truncations and the open claims ride in each batch's commit (custom metadata ``cdcflow.history``),
so a replayed batch reads them as the first run did.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdcflow.connectors.errors import ChangelogConsistencyError
from cdcflow.connectors.lakehouse.delta import key_links
from cdcflow.connectors.lakehouse.delta.batch import (
    TRUNCATE,
    coordinates,
    decide,
    describe,
    sortable,
    split_controls,
)
from cdcflow.connectors.lakehouse.delta.history import DeltaHistoryWriter
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, Storage
from cdcflow.connectors.lakehouse.delta.tables import applied_version, open_table, rows_of_keys

log = logging.getLogger(__name__)

START_AT, END_AT = "__START_AT", "__END_AT"
STATE = "cdcflow.history"
"""Commit metadata: the truncations and the open claims (:class:`HistoryState`)."""
STATE_LOOKBACK = 200
"""Commits read back for the last state (a widening's rewrite commits without it)."""
_ARRIVAL = "__cdcflow_arrival"


class HistoryApplier:
    """Applies changelog batches (Arrow tables) as versions of the SCD2 table at ``target``."""

    def __init__(
        self,
        target: str,
        options: ApplyOptions,
        time_column: str,
        *,
        app_id: str,
        storage: Storage = LOCAL,
    ) -> None:
        self.target = target
        self.options = options
        self.time = time_column
        self.storage = storage
        # the job's own ordering columns order the versions but stay out of the table
        self.writer = DeltaHistoryWriter(
            target,
            options.key,
            time_column,
            app_id=app_id,
            row_kind_column=options.row_kind_column,
            valid_from=START_AT,
            valid_to=END_AT,
            keep_time=time_column not in options.exclude,
            storage=storage,
        )

    def done(self, batch_id: int) -> bool:
        return self.writer.applied_batch() >= batch_id

    def apply(self, table: pa.Table, batch_id: int) -> BatchApplied:
        started = time.perf_counter()
        result = BatchApplied(batch_id, changes=table.num_rows)
        stored = open_table(self.target, self.storage)  # read once for the batch's lookups
        if applied_version(stored, self.writer.app_id) >= batch_id:
            result.skipped = True
            return result
        options = self.options
        table = table.append_column(_ARRIVAL, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        changes, controls = split_controls(table, options.control_column, None, None, batch_id)
        self._check_times(changes, batch_id)
        outcome = decide(controls, options.on_truncate)
        result.changes, result.truncates, result.control_events = (
            changes.num_rows,
            outcome.truncates,
            outcome.others,
        )
        state = _state(stored)
        truncations = list(state.truncations)
        if outcome.truncation is not None:  # every TRUNCATE of the batch, each at its time
            marks = pc.utf8_lower(pc.utf8_trim_whitespace(table.column(str(options.control_column))))
            truncates = table.filter(pc.fill_null(pc.equal(marks, TRUNCATE), False))
            self._check_times(truncates, batch_id)
            truncations = sorted({*truncations, *truncates.column(self.time).to_pylist()})
        ordered = changes.take(self._order(changes))
        fill = Fill(self, stored, ordered, state.claims, batch_id)
        result.unavailable_unfilled = fill.unfilled
        kinds = ordered.column(options.row_kind_column)
        applied = self.writer.apply(
            self._history_table(ordered, fill.values),
            batch_id,
            truncations,
            open_keys=outcome.truncation is not None,
            patches=fill.patches,
            metadata={STATE: HistoryState(truncations, fill.claims).to_json()},
        )
        result.upserts = int(pc.sum(pc.is_in(kinds, pa.array(["+I", "+U"]))).as_py() or 0)
        result.deletes = int(pc.sum(pc.equal(kinds, "-D")).as_py() or 0)
        result.late = applied.late
        result.table_version = applied.table_version
        result.seconds = time.perf_counter() - started
        return result

    def _check_times(self, table: pa.Table, batch_id: int) -> None:
        if self.time not in table.schema.names:
            raise ChangelogConsistencyError(
                f"batch {batch_id} has no column {self.time!r} (columns: {', '.join(table.schema.names)}): "
                "--mode scd2 needs each change's time; name it with --sequence-by"
            )
        nulls = np.asarray(table.column(self.time).is_null(), dtype=bool)
        if nulls.any():
            at = int(np.argmax(nulls))
            raise ChangelogConsistencyError(
                f"{describe(coordinates(table), at, at, batch_id)}: the change has no time ({self.time!r} is "
                "NULL); a version of --mode scd2 starts at its change's time: give --sequence-by a column "
                "every change has"
            )

    def _order(self, changes: pa.Table) -> pa.Array:
        """Time order; ties by the source's log position (``sequence_by``), then arrival."""
        keys = [(self.time, "ascending")]
        sequence = self.options.sequence_by
        if sequence is not None and sequence in changes.schema.names and sequence != self.time:
            changes = changes.append_column("__cdcflow_seq", sortable(changes.column(sequence), sequence))
            keys.append(("__cdcflow_seq", "ascending"))
        keys.append((_ARRIVAL, "ascending"))
        return pc.sort_indices(changes, sort_keys=keys)

    def versions(self, table: DeltaTable | None, keys: set[Key]) -> dict[Key, list[dict[str, Any]]]:
        """The versions ``table`` holds of each of ``keys``, by start."""
        if table is None or not keys:
            return {}
        schema = pa.schema(table.schema().to_arrow())
        key = list(self.options.key)
        wanted = pa.table(
            {c: pa.array([k[i] for k in keys], schema.field(c).type) for i, c in enumerate(key)}
        )
        rows = rows_of_keys(table, self.target, key, wanted, storage=self.storage)
        rows = rows.take(pc.sort_indices(rows, sort_keys=[(START_AT, "ascending")]))
        found: dict[Key, list[dict[str, Any]]] = {}
        for row in rows.to_pylist():
            found.setdefault(tuple(row[k] for k in key), []).append(row)
        return found

    def _history_table(self, ordered: pa.Table, filled: dict[int, dict[str, Any]]) -> pa.Table:
        """The batch as the history writer takes it: data, row kind and time; unavailable values set."""
        options = self.options
        aside = {*options.exclude, *options.links.columns, options.control_column} - {self.time}
        data = ordered.drop_columns(
            [c for c in ordered.schema.names if c in aside or c.startswith("__cdcflow")]
        )
        for column in {c for values in filled.values() for c in values}:
            values = data.column(column).to_pylist()
            for index, patch in filled.items():
                if column in patch:
                    values[index] = patch[column]
            position = data.schema.get_field_index(column)
            field = data.schema.field(position)
            data = data.set_column(position, field, pa.array(values, field.type))
        return data


Key = tuple[Any, ...]


def _state(table: DeltaTable | None) -> HistoryState:
    """The truncations and open claims the last batch committed: in the latest commit but for commits
    of others (a widening's rewrite, OPTIMIZE), read further back only then."""
    if table is None:
        return HistoryState([], [])
    for limit in (1, STATE_LOOKBACK):
        for commit in table.history(limit):
            if STATE in commit:
                return HistoryState.from_json(str(commit[STATE]))
    return HistoryState([], [])


@dataclass
class Claim:
    """A primary-key change's create whose unavailable values are its old key's, still to come: the
    versions of its key starting at ``starts`` take them; ``open`` columns are still carried on."""

    key: Key
    old: Key
    starts: dict[str, list[Any]]
    open: set[str]


@dataclass
class HistoryState:
    truncations: list[Any]
    claims: list[Claim]

    def to_json(self) -> str:
        claims = [
            {
                "key": [_encode(v) for v in claim.key],
                "old": [_encode(v) for v in claim.old],
                "starts": {c: [_encode(t) for t in times] for c, times in claim.starts.items()},
                "open": sorted(claim.open),
            }
            for claim in self.claims
        ]
        return json.dumps({"truncations": [_encode(t) for t in self.truncations], "claims": claims})

    @classmethod
    def from_json(cls, text: str) -> HistoryState:
        value = json.loads(text)
        claims = [
            Claim(
                tuple(_decode(v) for v in c["key"]),
                tuple(_decode(v) for v in c["old"]),
                {col: [_decode(t) for t in times] for col, times in c["starts"].items()},
                set(c["open"]),
            )
            for c in value["claims"]
        ]
        return cls([_decode(t) for t in value["truncations"]], claims)


class Fill:
    """The batch's unavailable values (row index: column: value), walked in time order: from the key's
    previous row (of the batch, else the table's open version), the old key's for the create of a
    primary-key change, else a claim on the old key's row; the claims its old keys' deletes resolve
    become ``patches`` of stored versions."""

    def __init__(
        self,
        applier: HistoryApplier,
        table: DeltaTable | None,
        ordered: pa.Table,
        claims: list[Claim],
        batch_id: int,
    ) -> None:
        self.values: dict[int, dict[str, Any]] = {}
        self.patches: dict[tuple[Key, Any], dict[str, Any]] = {}
        self.claims = list(claims)
        self.unfilled = 0
        links, options = applier.options.links, applier.options
        self.key, self.time = list(options.key), applier.time
        names = ordered.schema.names
        if links.unavailable is None or links.unavailable not in names:
            return
        column = functools.partial(_column, ordered)
        missing, olds, news = column(links.unavailable), column(links.old_key), column(links.new_key)
        if not any(missing) and not self.claims:
            return
        kinds = ordered.column(options.row_kind_column).to_pylist()
        rows = ordered.drop_columns([c for c in names if c.startswith("__cdcflow")]).to_pylist()
        own_keys = [tuple(row[k] for k in self.key) for row in rows]
        key_types = [ordered.schema.field(k).type for k in self.key]
        olds = key_links.parse(olds, self.key, key_types, batch_id, warn=False)
        news = key_links.parse(news, self.key, key_types, batch_id, warn=False)
        needed = {k for k, gone in zip(own_keys, missing, strict=True) if gone}
        needed |= {old for old in olds if old is not None}
        needed |= {claim.old for claim in self.claims} & set(own_keys)
        self.stored = applier.versions(table, needed)
        self.last: dict[Key, dict[str, Any]] = {}
        self.moved: dict[tuple[Key, Key], dict[str, Any]] = {}
        """(old key, new key): the old key's row its delete of a primary-key change left."""
        self.batch_rows: dict[tuple[Key, Any], int] = {}
        for index, (row, kind, gone, old, new) in enumerate(
            zip(rows, kinds, missing, olds, news, strict=True)
        ):
            own = own_keys[index]
            if kind == "-U":
                continue
            if kind == "-D":
                self._delete(own, new, row[self.time])
                continue
            self.batch_rows[(own, row[self.time])] = index
            self._change(index, own, row, gone or [], old)
        if self.unfilled:
            log.warning(
                "%d change(s) of %s keep an unavailable value NULL: no earlier value of their key in the "
                "batch or the table (read the topic from its start)",
                self.unfilled,
                applier.target,
            )

    def _change(self, index: int, own: Key, row: dict[str, Any], gone: list[str], old: Key | None) -> None:
        mine = [claim for claim in self.claims if claim.key == own]
        for earlier in mine:
            if old is not None:  # the key moved in again: the claim's versions stay as they are
                earlier.open.clear()
            else:
                earlier.open -= {c for c in earlier.open if c not in gone}
        claim = mine[-1] if mine else None
        at = row[self.time]
        if old is not None:  # the old key's row as its delete for this key left it, when seen
            before = self.moved.get((old, own)) or self._stored(old, at, ended=True)
        else:
            before = self.last[own] if own in self.last else self._stored(own, at)
        values: dict[str, Any] = {}
        claimed = []
        source = old if old is not None else own
        for name in gone:
            if claim is not None and name in claim.open:
                claim.starts[name].append(at)
            elif before is not None and name in before:
                values[name] = before[name]
                # a value its own key still waits for (a chain of key changes read out of order)
                self.unfilled += before[name] is None and self._pending(source, name)
            elif old is not None:
                claimed.append(name)
            else:
                self.unfilled += 1
        if claimed and old is not None:
            self.claims.append(Claim(own, old, {c: [row[self.time]] for c in claimed}, set(claimed)))
        self.values[index] = values
        self.last[own] = {**row, **values}

    def _pending(self, key: Key, name: str) -> bool:
        return any(claim.key == key and name in claim.starts for claim in self.claims)

    def _stored(self, key: Key, at: Any, ended: bool = False) -> dict[str, Any] | None:
        """The table's version of ``key`` that held just before a change at ``at``: one an earlier batch
        opened at that very time (the same transaction) first; ``ended``: the one that ended at ``at``."""

        def held(version: dict[str, Any]) -> bool:
            start, end = version[START_AT], version[END_AT]
            if ended:
                return bool(start < at and end == at)
            return bool(start < at and (end is None or end >= at)) or bool(
                start == at and (end is None or end > at)
            )

        found = [v for v in self.stored.get(key, []) if held(v)]
        return max(found, key=lambda v: v[START_AT]) if found else None

    def _delete(self, own: Key, moved: Key | None, at: Any) -> None:
        row = self.last.pop(own) if own in self.last else self._stored(own, at)
        for mine in self.claims:
            if mine.key == own:
                mine.open.clear()
        if moved is not None and row is not None:
            self.moved[(own, moved)] = row
        claim = next((c for c in self.claims if c.key == moved and c.old == own), None)
        if moved is None or claim is None:
            return
        self.claims.remove(claim)
        for name, starts in claim.starts.items():
            value = row.get(name) if row is not None else None
            # no row, or a value the old key itself still waits for (a chain of key changes)
            self.unfilled += row is None or name not in row or (value is None and self._pending(own, name))
            for start in starts:
                at = self.batch_rows.get((moved, start))
                if at is not None:
                    self.values.setdefault(at, {})[name] = value
                else:
                    self.patches.setdefault((moved, start), {})[name] = value
                    for version in self.stored.get(moved, []):  # as later changes of the batch read it
                        if version[START_AT] == start:
                            version[name] = value
            current = self.last.get(moved)
            if current is not None and name in claim.open:
                current[name] = value


def _column(table: pa.Table, name: str | None) -> list[Any]:
    if name is None or name not in table.schema.names:
        return [None] * table.num_rows
    return list(table.column(name).to_pylist())


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"at": value.isoformat()}
    if isinstance(value, date):
        return {"date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "at" in value:
            return datetime.fromisoformat(value["at"])
        if "date" in value:
            return date.fromisoformat(value["date"])
        return Decimal(value["decimal"])
    return value
