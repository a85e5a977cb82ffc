"""Values a change does not carry (Debezium's unchanged TOAST columns) and primary-key changes.

A column listed in a change's unavailable columns has no value in that change: it keeps the key's
previous value, the latest earlier change of the key in the batch that has it, else the target's
current row (the merge reads it: :func:`~cdcflow.connectors.lakehouse.delta.tables.merge_marked`'s
``unavailable``). After a delete of the key in the batch there is no previous value: the column lands
NULL and is reported.

A primary-key change arrives as a delete of the old key (with the new key) and a create of the new key
(with the old key), in either order, possibly in different batches. The create's unavailable columns
take the old key's last image before its delete. When both are in the batch they pair here; otherwise
the first to arrive leaves a slot in the key state under the new key: the delete its row's image (a
carry), the create a claim. The second finds the slot and removes it.

A create that arrives first takes the old key's image as it is then, which may be behind: the old key's
partition may not have delivered its last changes yet. So the claim lists the create's unavailable
columns as pending; each later change of the new key that carries one of them takes it off (a delete
of the new key empties the list). When the old key's delete arrives, its last image gives the columns
still pending, written to the new key's row in the same commit: on the new key's changes of the batch,
else as a patch row for the target (only when the target has the key). When the new key's row moves on
again (a key change of its own) while it waits, the wait moves with it: the claim keeps a pointer to
the next key, which waits in its turn (its own claim, or a mark on the carry its create will take), and
the old key's delete follows the pointers.

Only the changes of keys involved are walked in Python; a batch without any stays columnar.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta.batch import EPOCH, IDX, SEQ, ChangeBatch, sequence_order
from cdcflow.connectors.lakehouse.delta.key_state import (
    DELETED_AT,
    PENDING,
    SLOT,
    STATE_SEQ,
    TIMESTAMP,
    UPDATED_AT,
)
from cdcflow.connectors.lakehouse.delta.schema import to_delta_columns
from cdcflow.connectors.lakehouse.delta.tables import OP

log = logging.getLogger(__name__)

UNAVAILABLE = "_cdcflow_unavailable"
"""The merge source's ``list<string>`` column: the columns of a row that keep the target's value."""
CARRY_FROM = "_cdcflow_carry_from"
"""Key state: the old key (JSON of its values) a carry or claim slot belongs to."""
OWED_BY, MOVED_TO = "_cdcflow_owed_by", "_cdcflow_moved_to"
"""Key state: on a carry, the key whose delete owes its ``_cdcflow_pending`` columns; on a claim, the key
its wait moved to."""
MAX_HOPS = 64
CARRY, CLAIM = -2, -3
"""Key state slots under a new key: the old key's image (its delete came first), or a claim (the
create came first and took the image; ``_cdcflow_pending`` lists the columns still waiting for the old
key's last values)."""
INTERNAL = "_cdcflow_"

Key = tuple[Any, ...]
Lookup = Callable[[pa.Table], pa.Table | None]


@dataclass(frozen=True)
class Links:
    """Where a batch says which columns are unavailable and which keys a key change links."""

    unavailable: str | None = None
    old_key: str | None = None
    new_key: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in (self.unavailable, self.old_key, self.new_key) if c is not None)


@dataclass
class Filled:
    """A batch with the values its changes lacked filled in where the batch or the state had them."""

    batch: ChangeBatch
    pending: pa.Array | None = None
    """Per change: the columns the target row must give (null when none); None when no change has any."""
    unfilled: dict[int, list[str]] = field(default_factory=dict)
    """Per change: the columns with no previous value at all (they land NULL)."""
    state: pa.Table | None = None
    """Carry and claim slots to write to the key state (``_cdcflow_op`` U or D)."""
    patches: pa.Table | None = None
    """Rows of the target to update (``_cdcflow_op`` U) with an old key's last values: the new keys of
    claims whose old key's delete came in this batch and that have no change in it; ``_cdcflow_unavailable``
    names the columns each keeps."""


@dataclass(frozen=True)
class _Order:
    late: np.ndarray | None
    again: np.ndarray | None
    epoch: np.ndarray | None
    truncated: bool


@dataclass
class _Claim:
    """A key's claim: the key whose delete gives its values, the columns still waiting for them, and
    the key the wait moved to when this key's row moved on (a key change of its own) first."""

    source: str
    pending: set[str]
    stored: bool
    """A claim slot of the key is in the key state (this claim's, or one this batch replaces)."""
    moved_to: Key | None = None
    dirty: bool = False
    removed: bool = False


@dataclass
class _Image:
    values: dict[str, Any]
    base: dict[str, Any] | str
    """Where the columns not in ``values`` come from: ``"target"`` (the key's row), ``"none"``, or values."""


def open_claims(known: pa.Table | None) -> pa.Table | None:
    """The claims among ``known`` (key state rows) that still wait for values (None when none)."""
    if known is None or PENDING not in known.schema.names or not known.num_rows:
        return None
    waiting = pc.and_(pc.equal(known.column(SLOT), CLAIM), pc.is_valid(known.column(PENDING)))
    claims = known.filter(pc.fill_null(waiting, False))
    return claims if claims.num_rows else None


def needs_filling(
    batch: ChangeBatch, links: Links, key: Sequence[str] = (), claims: pa.Table | None = None
) -> np.ndarray | None:
    """The changes that lack values, link keys, or change a key with an open claim (None when there are
    none: the columnar path)."""
    extra = batch.extra
    flagged = np.zeros(batch.num_rows, dtype=bool)
    if links.unavailable in extra.schema.names:
        flagged |= np.asarray(
            pc.fill_null(pc.greater(pc.list_value_length(extra[links.unavailable]), 0), False)
        )
    for name in (links.old_key, links.new_key):
        if name in extra.schema.names:
            flagged |= np.asarray(pc.is_valid(extra[name]), dtype=bool)
    if claims is not None and batch.num_rows:
        names = list(key)
        probe = batch.data.select(names).append_column("_cdcflow_pos", batch.data.column(IDX))
        wanted = pa.table({c: claims.column(c).cast(probe.schema.field(c).type) for c in names})
        hits = probe.join(wanted.group_by(names).aggregate([]), names, use_threads=False)
        flagged[np.asarray(hits.column("_cdcflow_pos"), dtype=np.int64)] = True
    return flagged if flagged.any() else None


def fill(
    batch: ChangeBatch,
    key: Sequence[str],
    links: Links,
    target_rows: Lookup,
    state_rows: Lookup,
    now: datetime,
    *,
    claims: pa.Table | None = None,
    late: np.ndarray | None = None,
    again: np.ndarray | None = None,
    epoch: np.ndarray | None = None,
    truncated: bool = False,
) -> Filled:
    """Fills ``batch``'s unavailable columns and pairs its key changes.

    ``claims``: the open claims of the batch's keys (:func:`open_claims`); ``late``: the changes older
    than their key's applied sequence (never a previous value); ``again``: the changes at their key's
    applied sequence, applied changes a source sent again (they link no key change a second time);
    ``epoch``: the restarts of each key's log position (see ``restarts``), for the order the batch
    applies in; ``truncated``: the batch empties the table, and with it the new keys the state's claims
    wait for.
    """
    flagged = needs_filling(batch, links, key, claims)
    if flagged is None:
        return Filled(batch)
    order = _Order(late, again, epoch, truncated)
    return _Filler(batch, list(key), links, target_rows, state_rows, flagged, now, claims, order).run()


def canonical(values: Key) -> str:
    return json.dumps(list(values), default=str, separators=(",", ":"))


class _Filler:
    def __init__(
        self,
        batch: ChangeBatch,
        key: list[str],
        links: Links,
        target_rows: Lookup,
        state_rows: Lookup,
        flagged: np.ndarray,
        now: datetime,
        claims: pa.Table | None,
        order: _Order,
    ) -> None:
        data = batch.data
        internal = [c for c in data.schema.names if c.startswith(INTERNAL)]
        # Values read back from the target and the state are Delta's types: fill in those types.
        converted = to_delta_columns(data.drop_columns(internal))
        for name in internal:
            converted = converted.append_column(data.schema.field(name), data.column(name))
        self.batch = dataclasses.replace(batch, data=converted)
        self.key, self.links, self.now = key, links, now
        self.columns = [c for c in converted.schema.names if not c.startswith(INTERNAL)]
        self.key_types = [converted.schema.field(c).type for c in key]
        self.target_rows, self.state_rows, self.flagged = target_rows, state_rows, flagged
        self.late, self.again = order.late, order.again
        self.epoch, self.truncated = order.epoch, order.truncated
        self.claims: dict[Key, _Claim] = {}
        self.looked: set[Key] = set()
        for row in claims.to_pylist() if claims is not None else []:
            self._claim_of(row)

    def _extra(self, name: str | None, at: np.ndarray) -> list[Any]:
        if name is None or name not in self.batch.extra.schema.names:
            return [None] * len(at)
        values: list[Any] = self.batch.extra.column(name).take(pa.array(at)).to_pylist()
        return values

    def _parse(self, texts: list[Any]) -> list[Key | None]:
        """Key JSON texts (``{"id": 2}``) as key tuples of the batch's key types."""
        parsed: list[list[Any] | None] = []
        for text in texts:
            if text is None:
                parsed.append(None)
                continue
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("payload"), dict) and "schema" in obj:
                obj = obj["payload"]
            if not isinstance(obj, dict) or any(c not in obj for c in self.key):
                log.warning(
                    "batch %d: key link %r does not name the key columns %s; ignored",
                    self.batch.batch_id,
                    str(text)[:80],
                    ", ".join(self.key),
                )
                parsed.append(None)
                continue
            parsed.append([obj[c] for c in self.key])
        columns = []
        for i, kind in enumerate(self.key_types):
            values = [p[i] if p is not None else None for p in parsed]
            try:
                columns.append(pa.array(values).cast(kind).to_pylist())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                try:
                    columns.append(pa.array(values, kind).to_pylist())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    log.warning(
                        "batch %d: key links give %s values Arrow cannot read as %s; the key changes "
                        "of this batch carry no values",
                        self.batch.batch_id,
                        self.key[i],
                        kind,
                    )
                    return [None] * len(parsed)
        return [
            tuple(col[j] for col in columns) if parsed[j] is not None else None for j in range(len(parsed))
        ]

    def _unlinked(self, keys: list[Key | None], at: np.ndarray) -> list[Key | None]:
        """``keys`` (links of the changes at ``at``) without those of changes sent again."""
        if self.again is None:
            return keys
        return [None if self.again[i] else k for k, i in zip(keys, at.tolist(), strict=True)]

    def _keys_table(self, keys: Sequence[Key]) -> pa.Table:
        return pa.table(
            {c: pa.array([k[i] for k in keys], self.key_types[i]) for i, c in enumerate(self.key)}
        )

    def _lookup(self, lookup: Lookup, keys: set[Key]) -> dict[Key, list[dict[str, Any]]]:
        if not keys:
            return {}
        rows = lookup(self._keys_table(sorted(keys, key=canonical)))
        found: dict[Key, list[dict[str, Any]]] = {}
        for row in rows.to_pylist() if rows is not None else []:
            found.setdefault(tuple(row[c] for c in self.key), []).append(row)
        return found

    def run(self) -> Filled:
        batch, key = self.batch, self.key
        flagged_at = np.flatnonzero(self.flagged)
        flagged_keys = batch.data.select(key).take(pa.array(flagged_at)).to_pylist()
        olds = self._unlinked(self._parse(self._extra(self.links.old_key, flagged_at)), flagged_at)
        creating = batch.kinds[flagged_at] != "-D"
        involved = {tuple(r[c] for c in key) for r in flagged_keys}
        involved |= {o for o, c in zip(olds, creating, strict=True) if o is not None and c}
        positions = self._positions(involved)
        if self.late is not None:  # a late change is not applied: it gives no value to another
            positions = positions[~self.late[positions]]
        # Rank in the order last-wins applies (epoch, sequence, then arrival) and walk each key's changes.
        order = None
        if SEQ in batch.data.schema.names:
            ranked = batch.data
            if self.epoch is not None:
                ranked = ranked.append_column(EPOCH, pa.array(self.epoch))
            order = np.asarray(sequence_order(ranked), dtype=np.int64)
        rank = np.empty(batch.num_rows, dtype=np.int64)
        rank[order if order is not None else np.arange(batch.num_rows)] = np.arange(batch.num_rows)
        positions = positions[np.argsort(rank[positions], kind="stable")]
        take = pa.array(positions)
        self.rows = batch.data.select(self.columns).take(take).to_pylist()
        self.positions = positions.tolist()
        self.kinds = batch.kinds[positions].tolist()
        self.unavailable = self._extra(self.links.unavailable, positions)
        self.olds = self._unlinked(self._parse(self._extra(self.links.old_key, positions)), positions)
        self.news = self._unlinked(self._parse(self._extra(self.links.new_key, positions)), positions)
        self.sequences = (
            batch.data.column(SEQ).take(take).to_pylist() if SEQ in batch.data.schema.names else None
        )
        self.groups: dict[Key, list[int]] = {}
        for local, row in enumerate(self.rows):
            self.groups.setdefault(tuple(row[c] for c in key), []).append(local)
        creates = [
            (o, self._key(i)) for i, o in enumerate(self.olds) if o is not None and self.kinds[i] != "-D"
        ]
        departs = [
            (self._key(i), n, i) for i, n in enumerate(self.news) if n is not None and self.kinds[i] == "-D"
        ]
        self.slots: dict[tuple[Key, int], dict[str, Any]] = {}
        self._load_slots({n for _, n in creates} | {n for _, n, _ in departs})
        # The new keys a departing old key may owe values to: the target says whether they exist.
        owed = {n for _, n, _ in departs if n in self.claims and self.claims[n].pending}
        self.target = self._lookup(
            self.target_rows, {o for o, _ in creates} | {o for o, _, _ in departs} | owed
        )
        self.looked_target = {o for o, _ in creates} | {o for o, _, _ in departs} | owed
        self.departed: dict[tuple[Key, Key], _Image] = {}
        self.moving: dict[tuple[Key, Key], tuple[str, set[str]]] = {}
        self.owed: dict[Key, tuple[str, set[str] | None]] = {}
        self.final: dict[Key, _Image] = {}
        self.active: set[Key] = set()
        self.paired: set[tuple[Key, Key]] = set()
        self.state_out: list[dict[str, Any]] = []
        self.carries: dict[Key, dict[str, Any]] = {}
        self.pending: dict[int, list[str]] = {}
        self.unfilled: dict[int, list[str]] = {}
        self.changed: dict[str, dict[int, Any]] = {}
        self.patches: dict[Key, dict[str, Any]] = {}
        for k in self.groups:
            self._walk(k)
        unpaired = [(o, n, local) for o, n, local in departs if (o, n) not in self.paired]
        self._settle_all([(o, n) for o, n, local in unpaired if self._depart(o, n, local)])
        for k, claim in self.claims.items():
            if claim.removed:
                if claim.stored:
                    self.state_out.append(self._slot(k, CLAIM, "D"))
            elif claim.dirty:
                self.state_out.append(
                    self._slot(
                        k, CLAIM, "U", source=claim.source, pending=claim.pending, moved_to=claim.moved_to
                    )
                )
        return self._result()

    def _settle_all(self, pairs: list[tuple[Key, Key]]) -> None:
        """Settles the claims the batch's old keys' deletes end: after every carry of the batch is
        written (a wait may end at one), and a key's own move before the delete that gives it values
        (the move passes its wait on)."""
        by_old: dict[Key, list[tuple[Key, Key]]] = {}
        for pair in pairs:
            by_old.setdefault(pair[0], []).append(pair)
        done: set[tuple[Key, Key]] = set()
        for first in pairs:
            path, seen = [first], {first}
            while True:  # down the chain of moves this batch also settles
                after = [p for p in by_old.get(path[-1][1], []) if p not in done and p not in seen]
                if not after:
                    break
                path.append(after[0])
                seen.add(after[0])
            for pair in reversed(path):
                if pair not in done:
                    done.add(pair)
                    self._settle(*pair)

    def _load_slots(self, keys: set[Key]) -> None:
        """Reads the carry and claim slots of ``keys`` from the key state (once per key)."""
        for k, found in self._lookup(self.state_rows, keys - self.looked).items():
            for row in found:
                if row[SLOT] in (CARRY, CLAIM):
                    self.slots[(k, row[SLOT])] = row
                if row[SLOT] == CLAIM and k not in self.claims:
                    self._claim_of(row)
        self.looked |= keys

    def _claim_of(self, row: dict[str, Any]) -> None:
        text, moved = row.get(PENDING), row.get(MOVED_TO)
        pending = json.loads(text) if text and not self.truncated else []
        moved_to = self._parse([moved])[0] if moved and not self.truncated else None
        claim = _Claim(str(row[CARRY_FROM]), {str(c) for c in pending}, stored=True, moved_to=moved_to)
        self.claims[tuple(row[c] for c in self.key)] = claim

    def _key(self, local: int) -> Key:
        return tuple(self.rows[local][c] for c in self.key)

    def _positions(self, keys: set[Key]) -> np.ndarray:
        data = self.batch.data
        probe = data.select(self.key).append_column("_cdcflow_pos", data.column(IDX))
        wanted = self._keys_table(sorted(keys, key=canonical))
        hits = probe.join(wanted, self.key, join_type="inner", use_threads=False)
        return np.sort(np.asarray(hits.column("_cdcflow_pos"), dtype=np.int64))

    def _walk(self, k: Key) -> None:
        if k in self.final or k in self.active:
            return
        self.active.add(k)
        current = _Image({}, "target")
        for local in self.groups.get(k, []):
            row = self.rows[local]
            claim = self.claims.get(k)
            if self.kinds[local] == "-D":
                new = self.news[local]
                if new is not None:
                    self.departed[(k, new)] = current
                if claim is not None and claim.pending:
                    if new is not None:  # the wait moves on with the row (see _depart, _old_image)
                        self.moving[(k, new)] = (claim.source, claim.pending)
                        claim.moved_to = new
                    claim.pending, claim.dirty = set(), True
                current = _Image({}, "none")
                continue
            old = self.olds[local]
            if old is not None:
                current = _Image({}, self._old_image(old, k))
            missing = [c for c in self.unavailable[local] or () if c in row and c not in self.key]
            owed = self.owed.pop(k, None)
            if owed is not None:  # what this create took may be behind: it waits for the columns
                source, columns = owed
                waiting = set(missing) if columns is None else columns & set(missing)
                if columns is None or waiting:
                    stored = claim is not None and claim.stored
                    self.claims[k] = _Claim(source, waiting, stored=stored, dirty=True)
            elif claim is not None and claim.pending and self.kinds[local] != "-U":
                carried = claim.pending - set(missing) - set(self.key)
                carried &= set(row)
                if carried:
                    claim.pending -= carried
                    claim.dirty = True
            for column in missing:
                if column in current.values:
                    self._set(local, column, current.values[column])
                elif current.base == "target":
                    self.pending.setdefault(local, []).append(column)
                elif isinstance(current.base, dict) and column in current.base:
                    self._set(local, column, current.base[column])
                else:
                    self.unfilled.setdefault(local, []).append(column)
            unresolved = {*self.pending.get(local, ()), *self.unfilled.get(local, ())}
            current = _Image({c: v for c, v in row.items() if c not in unresolved}, current.base)
        self.active.discard(k)
        self.final[k] = current

    def _set(self, local: int, column: str, value: Any) -> None:
        self.rows[local][column] = value
        self.changed.setdefault(column, {})[self.positions[local]] = value

    def _old_image(self, old: Key, new: Key) -> dict[str, Any]:
        """The values a create of ``new`` takes from ``old``'s last image."""
        if old in self.groups:
            self._walk(old)
        if (old, new) in self.departed:
            self.paired.add((old, new))
            if (old, new) in self.moving:
                self.owed[new] = self.moving[(old, new)]
            return self._complete(self.departed[(old, new)], old)
        carry = self.slots.get((new, CARRY))
        if carry is not None and carry[CARRY_FROM] == canonical(old):
            self.state_out.append(self._slot(new, CARRY, "D"))
            if carry.get(OWED_BY) and carry.get(PENDING) and not self.truncated:
                self.owed[new] = (str(carry[OWED_BY]), set(json.loads(carry[PENDING])))
            return {c: carry.get(c) for c in self.columns}
        claim = self.claims.get(new)
        if claim is None or claim.source != canonical(old):
            self.owed[new] = (canonical(old), None)
        return self._complete(self.final.get(old, _Image({}, "target")), old)

    def _complete(self, image: _Image, owner: Key) -> dict[str, Any]:
        base = image.base
        if base == "target":
            found = self.target.get(owner)
            base = found[0] if found else {}
        return {**(base if isinstance(base, dict) else {}), **image.values}

    def _depart(self, old: Key, new: Key, local: int) -> bool:
        """The old key's delete came in this batch, its create did not: whether a claim waits for it,
        else its image stays under the new key (a carry)."""
        claim = self.claims.get(new)
        if claim is not None and claim.source == canonical(old):
            return True
        stored = self.slots.get((new, CLAIM))
        if stored is not None and stored[CARRY_FROM] == canonical(old):
            return False  # the new key was deleted and created anew from another key in this batch
        image = self._complete(self.departed.get((old, new), _Image({}, "target")), old)
        sequence = self.sequences[local] if self.sequences is not None else None
        source, pending = self.moving.get((old, new), (None, None))
        row = self._slot(
            new, CARRY, "U", source=old, values=image, sequence=sequence, pending=pending, owed_by=source
        )
        self.state_out.append(row)
        self.carries[new] = row
        return False

    def _settle(self, old: Key, new: Key) -> None:
        """Gives ``old``'s last values to the claim of ``new`` and to the keys its wait moved to."""
        image = self._complete(self.departed.get((old, new), _Image({}, "target")), old)
        source = canonical(old)
        # The old key's own wait, when it moved on before its delete: the end of the chain takes it.
        relay = self.moving.get((old, new))
        holder: Key | None = new
        last: tuple[Key, _Claim, set[str]] | None = None
        for _ in range(MAX_HOPS):
            claim = self._claim_at(holder) if holder is not None else None
            if holder is None or claim is None or claim.source != source:
                if holder is not None:
                    self._settle_carry(holder, source, image, relay, old)
                return
            waiting = set(claim.pending)
            if waiting:
                self._deliver(image, holder, waiting)
            claim.removed = True
            last, holder = (holder, claim, waiting), claim.moved_to
            if holder is None:
                break
        else:
            log.warning(
                "batch %d: the values of key %s moved along more than %d key changes before its delete "
                "arrived; the rest of the chain keeps older values",
                self.batch.batch_id,
                source,
                MAX_HOPS,
            )
        if relay is not None and last is not None:
            end, claim, waiting = last
            rest = relay[1] & waiting
            if rest:
                claim.source, claim.pending, claim.moved_to = relay[0], rest, None
                claim.removed, claim.dirty = False, True
                self._point(old, end)

    def _settle_carry(
        self,
        holder: Key,
        source: str,
        image: dict[str, Any],
        relay: tuple[str, set[str]] | None,
        relay_from: Key,
    ) -> None:
        """The chain ends at a carry (its key's create has not come yet) that waits for ``source``."""
        carry = self.carries.get(holder) or self.slots.get((holder, CARRY))
        if carry is None or carry.get(OWED_BY) != source or not carry.get(PENDING):
            return
        waiting = set(json.loads(carry[PENDING]))
        values = {c: carry.get(c) for c in self.columns} | {c: image[c] for c in waiting if c in image}
        rest = relay[1] & waiting if relay is not None else set()
        row = self._slot(
            holder,
            CARRY,
            "U",
            source=carry[CARRY_FROM],
            values=values,
            sequence=carry.get(STATE_SEQ),
            pending=rest,
            owed_by=relay[0] if relay is not None and rest else None,
        )
        if relay is not None and rest:
            self._point(relay_from, holder)
        if holder in self.carries:
            self.carries[holder].update(row)
        else:
            self.state_out.append(row)
            self.carries[holder] = row

    def _point(self, old: Key, end: Key) -> None:
        claim = self.claims.get(old)
        if claim is not None and not claim.removed:
            claim.moved_to, claim.dirty = end, True

    def _claim_at(self, k: Key) -> _Claim | None:
        if k not in self.claims:
            self._load_slots({k})
        return self.claims.get(k)

    def _target_row(self, k: Key) -> dict[str, Any] | None:
        if k not in self.target and k not in self.looked_target:
            self.looked_target.add(k)
            self.target.update(self._lookup(self.target_rows, {k}))
        found = self.target.get(k)
        return found[0] if found else None

    def _deliver(self, image: dict[str, Any], holder: Key, pending: set[str]) -> None:
        """An old key's last values of a claim's pending columns, to the holder's row."""
        values = {c: image[c] for c in sorted(pending) if c in image and c in self.columns}
        if not values:
            return
        walked = [local for local in self.groups.get(holder, []) if self.kinds[local] != "-D"]
        if walked:  # the holder changes in this batch (none of these changes has the columns)
            for local in walked:
                for column, value in values.items():
                    self._set(local, column, value)
                for marks in (self.pending, self.unfilled):
                    if local in marks:
                        marks[local] = [c for c in marks[local] if c not in values]
                        if not marks[local]:
                            del marks[local]
            return
        found = self._target_row(holder)
        if found is None:
            return
        patch = self.patches.setdefault(holder, {}) | values
        self.patches[holder] = {c: v for c, v in patch.items() if found.get(c) != v}

    def _slot(
        self,
        new: Key,
        slot: int,
        op: str,
        *,
        source: Key | str | None = None,
        values: dict[str, Any] | None = None,
        sequence: bytes | None = None,
        pending: set[str] | None = None,
        owed_by: str | None = None,
        moved_to: Key | None = None,
    ) -> dict[str, Any]:
        row = {c: v for c, v in (values or {}).items() if c in self.columns and c not in self.key}
        row |= dict(zip(self.key, new, strict=True))
        if op == "D":
            return {**row, SLOT: slot, OP: "D"}
        return {
            **row,
            SLOT: slot,
            STATE_SEQ: sequence,
            CARRY_FROM: canonical(source) if isinstance(source, tuple) else source,
            PENDING: json.dumps(sorted(pending)) if pending else None,
            OWED_BY: owed_by if pending else None,
            MOVED_TO: self._link(moved_to) if moved_to is not None else None,
            DELETED_AT: self.now,
            UPDATED_AT: self.now,
            OP: "U",
        }

    def _link(self, k: Key) -> str:
        """``k`` as a key link's JSON (what :meth:`_parse` reads)."""
        return json.dumps(dict(zip(self.key, k, strict=True)), default=str, separators=(",", ":"))

    def _result(self) -> Filled:
        data = self.batch.data
        n = data.num_rows
        for column, values in self.changed.items():
            at = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
            index = np.arange(n, dtype=np.int64)
            index[at] = n + np.arange(len(at), dtype=np.int64)
            original = data.column(column)
            merged = pa.concat_arrays(
                [original.combine_chunks(), pa.array(list(values.values()), original.type)]
            ).take(pa.array(index))
            data = data.set_column(data.schema.get_field_index(column), data.schema.field(column), merged)
        batch = dataclasses.replace(self.batch, data=data)
        pending = None
        if self.pending:
            marks: list[list[str] | None] = [None] * n
            for local, columns in self.pending.items():
                marks[self.positions[local]] = columns
            pending = pa.array(marks, pa.list_(pa.string()))
        unfilled = {self.positions[local]: columns for local, columns in self.unfilled.items()}
        return Filled(batch, pending, unfilled, self._state_table(), self._patch_table())

    def _patch_table(self) -> pa.Table | None:
        if not self.patches:
            return None
        schema = self.batch.data.schema
        fields = [
            *(schema.field(c) for c in self.columns),
            pa.field(UNAVAILABLE, pa.list_(pa.string())),
            pa.field(OP, pa.string()),
        ]
        rows = [
            {
                **dict(zip(self.key, k, strict=True)),
                **values,
                UNAVAILABLE: [c for c in self.columns if c not in values and c not in self.key],
                OP: "U",
            }
            for k, values in self.patches.items()
            if values
        ]
        if not rows:
            return None
        return pa.Table.from_pylist(rows, schema=pa.schema(fields))

    def _state_table(self) -> pa.Table | None:
        if not self.state_out:
            return None
        schema = self.batch.data.schema
        fields = [
            *(schema.field(c).with_nullable(c not in self.key) for c in self.columns),
            pa.field(SLOT, pa.int32(), nullable=False),
            pa.field(STATE_SEQ, pa.large_binary()),
            pa.field(CARRY_FROM, pa.string()),
            pa.field(PENDING, pa.string()),
            pa.field(OWED_BY, pa.string()),
            pa.field(MOVED_TO, pa.string()),
            pa.field(DELETED_AT, TIMESTAMP),
            pa.field(UPDATED_AT, TIMESTAMP),
            pa.field(OP, pa.string()),
        ]
        return pa.Table.from_pylist(self.state_out, schema=pa.schema(fields))
