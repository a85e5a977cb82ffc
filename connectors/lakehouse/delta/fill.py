"""The fill of values a change does not carry (Debezium's unchanged TOAST columns), and primary-key
changes.

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

Only the changes of the keys involved are walked in Python, key by key; a batch without any stays
columnar (:func:`needs_filling`). What a fill reads are its :class:`FillInputs`; what it decides and
gives, :mod:`.fill_result`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta.batch import (
    EPOCH,
    IDX,
    INTERNAL,
    SEQ,
    ChangeBatch,
    positions_in,
    rows_with_keys,
    sequence_order,
)
from cdcflow.connectors.lakehouse.delta.fill_result import Filled, Fills, filled
from cdcflow.connectors.lakehouse.delta.key_change_slots import (
    CARRY,
    CARRY_FROM,
    CLAIM,
    OWED_BY,
    Claim,
    SlotWriter,
    stored_claim,
)
from cdcflow.connectors.lakehouse.delta.key_links import Key, canonical, parse
from cdcflow.connectors.lakehouse.delta.key_state import PENDING, SLOT, STATE_SEQ
from cdcflow.connectors.lakehouse.delta.options import Links
from cdcflow.connectors.lakehouse.delta.tables import delta_type, to_delta_columns

log = logging.getLogger(__name__)

MAX_HOPS = 64
"""The most key changes an old key's last values follow to reach the claims that wait for them."""


def fill(inputs: FillInputs, claims: pa.Table | None = None) -> Filled:
    """Fills the batch's unavailable columns and pairs its key changes.

    ``claims``: the open claims of the batch's keys (:func:`open_claims`).
    """
    flagged = needs_filling(inputs.source, inputs.links, inputs.key, claims)
    if flagged is None:
        return Filled(inputs.source)
    known = Known(inputs, claims)
    return _Walk(inputs, involved_changes(inputs, flagged), known).run()


class Known:
    """What the key state and the target hold for the keys the walk looks at, each key read once: the
    carry and claim slots, the claims (the walk makes and ends some), the target's rows."""

    def __init__(self, inputs: FillInputs, claims: pa.Table | None) -> None:
        self.inputs = inputs
        self.slots: dict[tuple[Key, int], dict[str, Any]] = {}
        self.claims: dict[Key, Claim] = {}
        self.looked: set[Key] = set()
        self.target: dict[Key, list[dict[str, Any]]] = {}
        self.looked_target: set[Key] = set()
        for row in claims.to_pylist() if claims is not None else []:
            self._add_claim(row)

    def lookup(self, lookup: Lookup, keys: set[Key]) -> dict[Key, list[dict[str, Any]]]:
        if not keys:
            return {}
        key = self.inputs.key
        rows = lookup(self.inputs.keys_table(sorted(keys, key=canonical)))
        found: dict[Key, list[dict[str, Any]]] = {}
        for row in rows.to_pylist() if rows is not None else []:
            found.setdefault(tuple(row[c] for c in key), []).append(row)
        return found

    def load_slots(self, keys: set[Key]) -> None:
        """Reads the carry and claim slots of ``keys`` from the key state (once per key)."""
        for k, found in self.lookup(self.inputs.state_rows, keys - self.looked).items():
            for row in found:
                if row[SLOT] in (CARRY, CLAIM):
                    self.slots[(k, row[SLOT])] = row
                if row[SLOT] == CLAIM and k not in self.claims:
                    self._add_claim(row)
        self.looked |= keys

    def read_target(self, keys: set[Key]) -> None:
        """Reads the target's rows of ``keys``."""
        self.target.update(self.lookup(self.inputs.target_rows, keys))
        self.looked_target |= keys

    def claim_at(self, k: Key) -> Claim | None:
        if k not in self.claims:
            self.load_slots({k})
        return self.claims.get(k)

    def target_row(self, k: Key) -> dict[str, Any] | None:
        if k not in self.target and k not in self.looked_target:
            self.looked_target.add(k)
            self.target.update(self.lookup(self.inputs.target_rows, {k}))
        found = self.target.get(k)
        return found[0] if found else None

    def _add_claim(self, row: dict[str, Any]) -> None:
        inputs = self.inputs
        k, claim = stored_claim(row, inputs.key, inputs.key_types, inputs.batch.batch_id, inputs.truncated)
        self.claims[k] = claim


@dataclass
class _Image:
    values: dict[str, Any]
    base: dict[str, Any] | str
    """Where the columns not in ``values`` come from: ``"target"`` (the key's row), ``"none"``, or values."""


@dataclass
class _Progress:
    """Where the walk is, per key and per key change (an old key and the new key it links)."""

    final: dict[Key, _Image] = field(default_factory=dict)
    """The image each walked key ends the batch with."""
    active: set[Key] = field(default_factory=set)
    """The keys being walked (a create walks its old key first)."""
    departed: dict[tuple[Key, Key], _Image] = field(default_factory=dict)
    """The old key's image at its delete."""
    paired: set[tuple[Key, Key]] = field(default_factory=set)
    """Key changes whose delete and create both came in this batch."""
    moving: dict[tuple[Key, Key], tuple[str, set[str]]] = field(default_factory=dict)
    """The old key's own wait (source, pending columns), moved on with its row."""
    owed: dict[Key, tuple[str, set[str] | None]] = field(default_factory=dict)
    """Per new key: the key whose delete owes its create's columns (None: all it lacks)."""


class _Walk:
    """Walks the changes of the keys involved, pairing key changes and filling in values."""

    def __init__(self, inputs: FillInputs, changes: Changes, known: Known) -> None:
        self.inputs = inputs
        self.changes = changes
        self.known = known
        self.writer = SlotWriter(inputs.key, inputs.columns, inputs.now)
        self.progress = _Progress()
        self.out = Fills()

    def run(self) -> Filled:
        changes, known, progress = self.changes, self.known, self.progress
        creates = [
            (o, self._key(i))
            for i, o in enumerate(changes.olds)
            if o is not None and changes.kinds[i] != "-D"
        ]
        departs = [
            (self._key(i), n, i)
            for i, n in enumerate(changes.news)
            if n is not None and changes.kinds[i] == "-D"
        ]
        known.load_slots({n for _, n in creates} | {n for _, n, _ in departs})
        # The new keys a departing old key may owe values to: the target says whether they exist.
        owed = {n for _, n, _ in departs if n in known.claims and known.claims[n].pending}
        known.read_target({o for o, _ in creates} | {o for o, _, _ in departs} | owed)
        for k in changes.groups:
            self._walk(k)
        unpaired = [(o, n, local) for o, n, local in departs if (o, n) not in progress.paired]
        self._settle_all([(o, n) for o, n, local in unpaired if self._depart(o, n, local)])
        self._write_claims()
        inputs = self.inputs
        state = self.writer.table(self.out.slot_rows, inputs.batch.data.schema)
        return filled(inputs.batch, inputs.key, inputs.columns, changes.positions, self.out, state)

    def _write_claims(self) -> None:
        for k, claim in self.known.claims.items():
            if claim.removed:
                if claim.stored:
                    self.out.slot_rows.append(self.writer.row(k, CLAIM, "D"))
            elif claim.dirty:
                self.out.slot_rows.append(
                    self.writer.row(
                        k, CLAIM, "U", source=claim.source, pending=claim.pending, moved_to=claim.moved_to
                    )
                )

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

    def _key(self, local: int) -> Key:
        return tuple(self.changes.rows[local][c] for c in self.inputs.key)

    def _walk(self, k: Key) -> None:
        changes, progress, claims = self.changes, self.progress, self.known.claims
        if k in progress.final or k in progress.active:
            return
        progress.active.add(k)
        current = _Image({}, "target")
        for local in changes.groups.get(k, []):
            row = changes.rows[local]
            claim = claims.get(k)
            if changes.kinds[local] == "-D":
                new = changes.news[local]
                if new is not None:
                    progress.departed[(k, new)] = current
                if claim is not None and claim.pending:
                    if new is not None:  # the wait moves on with the row (see _depart, _old_image)
                        progress.moving[(k, new)] = (claim.source, claim.pending)
                        claim.moved_to = new
                    claim.pending, claim.dirty = set(), True
                current = _Image({}, "none")
                continue
            old = changes.olds[local]
            if old is not None:
                current = _Image({}, self._old_image(old, k))
            missing = [c for c in changes.unavailable[local] or () if c in row and c not in self.inputs.key]
            owed = progress.owed.pop(k, None)
            if owed is not None:  # what this create took may be behind: it waits for the columns
                source, columns = owed
                waiting = set(missing) if columns is None else columns & set(missing)
                if columns is None or waiting:
                    stored = claim is not None and claim.stored
                    claims[k] = Claim(source, waiting, stored=stored, dirty=True)
            elif claim is not None and claim.pending and changes.kinds[local] != "-U":
                carried = claim.pending - set(missing) - set(self.inputs.key)
                carried &= set(row)
                if carried:
                    claim.pending -= carried
                    claim.dirty = True
            self._fill(local, missing, current)
            unresolved = {*self.out.pending.get(local, ()), *self.out.unfilled.get(local, ())}
            current = _Image({c: v for c, v in row.items() if c not in unresolved}, current.base)
        progress.active.discard(k)
        progress.final[k] = current

    def _fill(self, local: int, missing: list[str], current: _Image) -> None:
        """The ``missing`` columns of change ``local``, from its key's ``current`` image."""
        for column in missing:
            if column in current.values:
                self._set(local, column, current.values[column])
            elif current.base == "target":
                self.out.pending.setdefault(local, []).append(column)
            elif isinstance(current.base, dict) and column in current.base:
                self._set(local, column, current.base[column])
            else:
                self.out.unfilled.setdefault(local, []).append(column)

    def _set(self, local: int, column: str, value: Any) -> None:
        self.changes.rows[local][column] = value
        self.out.changed.setdefault(column, {})[self.changes.positions[local]] = value

    def _old_image(self, old: Key, new: Key) -> dict[str, Any]:
        """The values a create of ``new`` takes from ``old``'s last image."""
        progress = self.progress
        if old in self.changes.groups:
            self._walk(old)
        if (old, new) in progress.departed:
            progress.paired.add((old, new))
            if (old, new) in progress.moving:
                progress.owed[new] = progress.moving[(old, new)]
            return self._complete(progress.departed[(old, new)], old)
        carry = self.known.slots.get((new, CARRY))
        if carry is not None and carry[CARRY_FROM] == canonical(old):
            self.out.slot_rows.append(self.writer.row(new, CARRY, "D"))
            if carry.get(OWED_BY) and carry.get(PENDING) and not self.inputs.truncated:
                progress.owed[new] = (str(carry[OWED_BY]), set(json.loads(carry[PENDING])))
            return {c: carry.get(c) for c in self.inputs.columns}
        claim = self.known.claims.get(new)
        if claim is None or claim.source != canonical(old):
            progress.owed[new] = (canonical(old), None)
        return self._complete(progress.final.get(old, _Image({}, "target")), old)

    def _complete(self, image: _Image, owner: Key) -> dict[str, Any]:
        base = image.base
        if base == "target":
            found = self.known.target.get(owner)
            base = found[0] if found else {}
        return {**(base if isinstance(base, dict) else {}), **image.values}

    def _depart(self, old: Key, new: Key, local: int) -> bool:
        """The old key's delete came in this batch, its create did not: whether a claim waits for it,
        else its image stays under the new key (a carry)."""
        progress = self.progress
        claim = self.known.claims.get(new)
        if claim is not None and claim.source == canonical(old):
            return True
        stored = self.known.slots.get((new, CLAIM))
        if stored is not None and stored[CARRY_FROM] == canonical(old):
            return False  # the new key was deleted and created anew from another key in this batch
        image = self._complete(progress.departed.get((old, new), _Image({}, "target")), old)
        sequences = self.changes.sequences
        sequence = sequences[local] if sequences is not None else None
        source, pending = progress.moving.get((old, new), (None, None))
        row = self.writer.row(
            new, CARRY, "U", source=old, values=image, sequence=sequence, pending=pending, owed_by=source
        )
        self.out.slot_rows.append(row)
        self.out.carries[new] = row
        return False

    def _settle(self, old: Key, new: Key) -> None:
        """Gives ``old``'s last values to the claim of ``new`` and to the keys its wait moved to."""
        image = self._complete(self.progress.departed.get((old, new), _Image({}, "target")), old)
        source = canonical(old)
        # The old key's own wait, when it moved on before its delete: the end of the chain takes it.
        relay = self.progress.moving.get((old, new))
        holder: Key | None = new
        last: tuple[Key, Claim, set[str]] | None = None
        for _ in range(MAX_HOPS):
            claim = self.known.claim_at(holder) if holder is not None else None
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
                self.inputs.batch.batch_id,
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
        carries = self.out.carries
        carry = carries.get(holder) or self.known.slots.get((holder, CARRY))
        if carry is None or carry.get(OWED_BY) != source or not carry.get(PENDING):
            return
        waiting = set(json.loads(carry[PENDING]))
        values = {c: carry.get(c) for c in self.inputs.columns} | {c: image[c] for c in waiting if c in image}
        rest = relay[1] & waiting if relay is not None else set()
        row = self.writer.row(
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
        if holder in carries:
            carries[holder].update(row)
        else:
            self.out.slot_rows.append(row)
            carries[holder] = row

    def _point(self, old: Key, end: Key) -> None:
        claim = self.known.claims.get(old)
        if claim is not None and not claim.removed:
            claim.moved_to, claim.dirty = end, True

    def _deliver(self, image: dict[str, Any], holder: Key, pending: set[str]) -> None:
        """An old key's last values of a claim's pending columns, to the holder's row."""
        values = {c: image[c] for c in sorted(pending) if c in image and c in self.inputs.columns}
        if not values:
            return
        changes, out = self.changes, self.out
        walked = [local for local in changes.groups.get(holder, []) if changes.kinds[local] != "-D"]
        if walked:  # the holder changes in this batch (none of these changes has the columns)
            for local in walked:
                for column, value in values.items():
                    self._set(local, column, value)
                for marks in (out.pending, out.unfilled):
                    if local in marks:
                        marks[local] = [c for c in marks[local] if c not in values]
                        if not marks[local]:
                            del marks[local]
            return
        found = self.known.target_row(holder)
        if found is None:
            return
        patch = out.patches.setdefault(holder, {}) | values
        out.patches[holder] = {c: v for c, v in patch.items() if found.get(c) != v}


Lookup = Callable[[pa.Table], pa.Table | None]
"""The rows (of the target, or of the key state) of the keys in a table of key columns."""


@dataclass(frozen=True)
class FillInputs:
    """The batch, its key and links, where earlier values are looked up, and the order the batch
    applies in.

    ``late``: the changes older than their key's applied sequence (never a previous value); ``again``:
    the changes at their key's applied sequence, applied changes a source sent again (they link no key
    change a second time); ``epoch``: the restarts of each key's log position (``sequencing.epochs``);
    ``truncated``: the batch empties the table, and with it the new keys the state's claims wait for.
    """

    source: ChangeBatch
    """The batch as the applier has it; :attr:`batch` is it in Delta's types."""
    key: Sequence[str]
    links: Links
    target_rows: Lookup
    state_rows: Lookup
    now: datetime
    late: np.ndarray | None = None
    again: np.ndarray | None = None
    epoch: np.ndarray | None = None
    truncated: bool = False

    @cached_property
    def batch(self) -> ChangeBatch:
        """The batch in Delta's types (values read back from the target and the state are in those)."""
        data = self.source.data
        internal = [c for c in data.schema.names if c.startswith(INTERNAL)]
        converted = to_delta_columns(data.drop_columns(internal))
        for name in internal:
            converted = converted.append_column(data.schema.field(name), data.column(name))
        return dataclasses.replace(self.source, data=converted)

    @cached_property
    def key_types(self) -> list[pa.DataType]:
        return [self.batch.data.schema.field(c).type for c in self.key]

    @cached_property
    def columns(self) -> list[str]:
        """The data columns (not the applier's own ``_cdcflow_*``)."""
        return [c for c in self.batch.data.schema.names if not c.startswith(INTERNAL)]

    def aside_values(self, name: str | None, at: np.ndarray) -> list[Any]:
        """The values of the batch's column ``name`` kept aside (see ``ChangeBatch.extra``) at ``at``."""
        if name is None or name not in self.batch.extra.schema.names:
            return [None] * len(at)
        values: list[Any] = self.batch.extra.column(name).take(pa.array(at)).to_pylist()
        return values

    def parse(self, texts: list[Any]) -> list[Key | None]:
        """Key links as key tuples of the batch's key types."""
        return parse(texts, self.key, self.key_types, self.batch.batch_id)

    def unlinked(self, keys: list[Key | None], at: np.ndarray) -> list[Key | None]:
        """``keys`` (links of the changes at ``at``) without those of changes sent again."""
        if self.again is None:
            return keys
        return [None if self.again[i] else k for k, i in zip(keys, at.tolist(), strict=True)]

    def keys_table(self, keys: Sequence[Key]) -> pa.Table:
        return pa.table(
            {c: pa.array([k[i] for k in keys], self.key_types[i]) for i, c in enumerate(self.key)}
        )

    def positions(self, keys: set[Key]) -> np.ndarray:
        """The arrival positions of the changes of ``keys``, ascending."""
        data = self.batch.data
        probe = data.select(self.key).append_column("_cdcflow_pos", data.column(IDX))
        wanted = self.keys_table(sorted(keys, key=canonical))
        hits = probe.join(wanted, self.key, join_type="inner", use_threads=False)
        return np.sort(np.asarray(hits.column("_cdcflow_pos"), dtype=np.int64))


@dataclass(frozen=True)
class Changes:
    """The changes of the keys involved, in the order last-wins applies them: ``local`` indexes these
    lists, ``positions[local]`` is the change's arrival position in the batch."""

    rows: list[dict[str, Any]]
    """The data columns of each change (the walk sets the values it fills in)."""
    positions: list[int]
    kinds: list[str]
    unavailable: list[Any]
    """The columns each change lacks (None: none)."""
    olds: list[Key | None]
    """The old key a create links (a primary-key change), else None."""
    news: list[Key | None]
    """The new key a delete links (a primary-key change), else None."""
    sequences: list[Any] | None
    groups: dict[Key, list[int]]
    """Per key, its changes (``local``) in order."""


def involved_changes(inputs: FillInputs, flagged: np.ndarray) -> Changes:
    """The changes of the keys ``flagged`` changes have or link (a create: its old key), late ones left
    out (a late change is not applied: it gives no value to another)."""
    batch, key = inputs.batch, inputs.key
    flagged_at = np.flatnonzero(flagged)
    flagged_keys = batch.data.select(key).take(pa.array(flagged_at)).to_pylist()
    olds = inputs.unlinked(inputs.parse(inputs.aside_values(inputs.links.old_key, flagged_at)), flagged_at)
    creating = batch.kinds[flagged_at] != "-D"
    involved = {tuple(r[c] for c in key) for r in flagged_keys}
    involved |= {o for o, c in zip(olds, creating, strict=True) if o is not None and c}
    positions = inputs.positions(involved)
    if inputs.late is not None:
        positions = positions[~inputs.late[positions]]
    # Rank in the order last-wins applies (epoch, sequence, then arrival) and walk each key's changes.
    order = None
    if SEQ in batch.data.schema.names:
        ranked = batch.data
        if inputs.epoch is not None:
            ranked = ranked.append_column(EPOCH, pa.array(inputs.epoch))
        order = np.asarray(sequence_order(ranked), dtype=np.int64)
    rank = np.empty(batch.num_rows, dtype=np.int64)
    rank[order if order is not None else np.arange(batch.num_rows)] = np.arange(batch.num_rows)
    positions = positions[np.argsort(rank[positions], kind="stable")]
    take = pa.array(positions)
    rows = batch.data.select(inputs.columns).take(take).to_pylist()
    kinds = batch.kinds[positions].tolist()
    unavailable = inputs.aside_values(inputs.links.unavailable, positions)
    olds = inputs.unlinked(inputs.parse(inputs.aside_values(inputs.links.old_key, positions)), positions)
    news = inputs.unlinked(inputs.parse(inputs.aside_values(inputs.links.new_key, positions)), positions)
    sequences = batch.data.column(SEQ).take(take).to_pylist() if SEQ in batch.data.schema.names else None
    groups: dict[Key, list[int]] = {}
    for local, row in enumerate(rows):
        groups.setdefault(tuple(row[c] for c in key), []).append(local)
    return Changes(rows, positions.tolist(), kinds, unavailable, olds, news, sequences, groups)


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


def link_keys(batch: ChangeBatch, links: Links, key: Sequence[str]) -> pa.Table | None:
    """The keys the batch's primary-key changes name (old and new) in Delta's types, or None: the keys
    beyond the batch's own the walk looks up in the key state, so the applier reads them with the
    batch's (:func:`covered`)."""
    extra = batch.extra
    texts = [
        text
        for name in (links.old_key, links.new_key)
        if name in extra.schema.names
        for text in pc.drop_null(extra.column(name)).to_pylist()
    ]
    if not texts:
        return None
    types = [delta_type(batch.data.schema.field(c).type) for c in key]
    keys = {k for k in parse(texts, key, types, batch.batch_id, warn=False) if k is not None}
    if not keys:
        return None
    return pa.table({c: pa.array([k[i] for k in keys], types[i]) for i, c in enumerate(key)})


def covered(rows: pa.Table | None, keys: pa.Table, key: Sequence[str], read: Lookup) -> Lookup:
    """A lookup that answers from ``rows``, read before for ``keys`` (in Delta's types), when those hold
    every key asked for, and reads otherwise."""
    names = list(key)
    distinct: list[pa.Table] = []  # made at the first lookup: most batches fill nothing

    def lookup(wanted: pa.Table) -> pa.Table | None:
        if rows is None:
            return read(wanted)
        if not distinct:
            distinct.append(keys.select(names).group_by(names).aggregate([]))
        if not bool(np.all(positions_in(wanted, distinct[0], names) >= 0)):
            return read(wanted)
        return rows_with_keys(rows, wanted, names)

    return lookup
