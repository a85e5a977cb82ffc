"""The fill of unavailable columns and the pairing of primary-key changes: a walk over the changes of the
keys involved, key by key (what it does and why: :mod:`.unavailable`)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdcflow.connectors.lakehouse.delta.fill_inputs import Changes, FillInputs, Lookup, involved_changes
from cdcflow.connectors.lakehouse.delta.fill_result import Fills, filled
from cdcflow.connectors.lakehouse.delta.key_change_slots import (
    CARRY,
    CARRY_FROM,
    CLAIM,
    OWED_BY,
    Claim,
    SlotWriter,
    stored_claim,
)
from cdcflow.connectors.lakehouse.delta.key_links import Key, canonical
from cdcflow.connectors.lakehouse.delta.key_state import PENDING, SLOT, STATE_SEQ
from cdcflow.connectors.lakehouse.delta.unavailable import Filled, needs_filling

log = logging.getLogger(__name__)

MAX_HOPS = 64
"""The most key changes an old key's last values follow to reach the claims that wait for them."""


def fill(inputs: FillInputs, claims: pa.Table | None = None) -> Filled:
    """Fills the batch's unavailable columns and pairs its key changes.

    ``claims``: the open claims of the batch's keys (:func:`~.unavailable.open_claims`).
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
