"""Parse and validate ``op_mapping`` once, before any row flows (spec 4.3.6).

Two spellings are accepted, as in the spec:

* the MAP form, a dict whose keys and values may be comma lists:
  ``{"c, r": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER"}``;
* the ARRAY form, a dict with tuple keys and list values, or a list of pairs:
  ``{("UPDATE_BEFORE", "UPDATE_AFTER"): ["u"]}`` / ``[(["c", "r"], ["INSERT"])]``.

For ``from_changelog`` the keys are the input operation codes and the values the row kinds; for
``to_changelog`` the keys are the row kinds and the values the output codes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdcflow.core.errors import OpMappingError
from cdcflow.core.rowkind import DEL, INS, UA, UB, RowKind

# Keys are invariant in Mapping, so the accepted shapes (str or tuple keys, str or list values) are
# checked at run time, entry by entry.
OpMappingInput = Mapping[Any, Any] | Sequence[tuple[Any, Any]]

VALID_GROUPINGS: tuple[frozenset[RowKind], ...] = (
    frozenset({INS}),
    frozenset({UB}),
    frozenset({UA}),
    frozenset({DEL}),
    frozenset({UB, UA}),
    frozenset({INS, UA}),
    frozenset({INS, UB, UA}),
)
_KIND_NAMES = ", ".join(k.name for k in RowKind)


@dataclass(frozen=True)
class FromOpMapping:
    """Input operation code → the row kinds it stands for."""

    groups: Mapping[str, frozenset[RowKind]]
    is_default: bool = False

    def lookup(self, code: str) -> frozenset[RowKind] | None:
        return self.groups.get(code)

    @property
    def output_kinds(self) -> frozenset[RowKind]:
        return frozenset().union(*self.groups.values())


@dataclass(frozen=True)
class ToOpMapping:
    """Row kind → output operation code. Kinds with no code are dropped."""

    codes: Mapping[RowKind, str]
    is_default: bool = False

    def code_for(self, kind: RowKind) -> str | None:
        return self.codes.get(kind)

    @property
    def combines_updates(self) -> bool:
        """``-U`` and ``+U`` share one entry: they are written as one record with both images."""
        return UB in self.codes and self.codes.get(UB) == self.codes.get(UA)


DEFAULT_FROM_MAPPING = FromOpMapping({k.name: frozenset({k}) for k in RowKind}, is_default=True)
DEFAULT_TO_MAPPING = ToOpMapping({k: k.name for k in RowKind}, is_default=True)


def parse_from_op_mapping(mapping: OpMappingInput | None) -> FromOpMapping:
    """Validate a ``from_changelog`` mapping: codes on the key side, row kinds on the value side."""
    if mapping is None:
        return DEFAULT_FROM_MAPPING
    groups: dict[str, frozenset[RowKind]] = {}
    seen_kinds: set[RowKind] = set()
    for codes, kind_names in _entries(mapping):
        kinds = _parse_kind_group(kind_names, side="value", function="from_changelog", seen=seen_kinds)
        for code in codes:
            if code in groups:
                raise OpMappingError(
                    f"op_mapping lists the operation code '{code}' twice; an input code maps to one "
                    "group of row kinds (rule: each code at most once)"
                )
            groups[code] = kinds
    return FromOpMapping(groups)


def parse_to_op_mapping(mapping: OpMappingInput | None) -> ToOpMapping:
    """Validate a ``to_changelog`` mapping: row kinds on the key side, one output code as value."""
    if mapping is None:
        return DEFAULT_TO_MAPPING
    codes: dict[RowKind, str] = {}
    entry_of_code: dict[str, tuple[str, ...]] = {}
    seen_kinds: set[RowKind] = set()
    for kind_names, output_codes in _entries(mapping):
        kinds = _parse_kind_group(kind_names, side="key", function="to_changelog", seen=seen_kinds)
        if len(output_codes) != 1:
            raise OpMappingError(
                f"op_mapping entry {list(kind_names)} must map to exactly one output code, got "
                f"{list(output_codes)} (rule: to_changelog writes one code per record)"
            )
        code = output_codes[0]
        # Two entries writing one code would let an invalid grouping in by the back door.
        if code in entry_of_code:
            raise OpMappingError(
                f"op_mapping writes the code '{code}' for both {list(entry_of_code[code])} and "
                f"{list(kind_names)}: put the row kinds in one entry, e.g. "
                f"'{', '.join([*entry_of_code[code], *kind_names])}' (rule: grouped row kinds must "
                "be compatible)"
            )
        entry_of_code[code] = kind_names
        for kind in kinds:
            codes[kind] = code
    return ToOpMapping(codes)


def _entries(mapping: OpMappingInput) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    if isinstance(mapping, Mapping):
        pairs = list(mapping.items())
    elif isinstance(mapping, Sequence) and not isinstance(mapping, str):
        pairs = []
        for pair in mapping:
            if not (isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2):
                raise OpMappingError(f"op_mapping as a list must hold (key, value) pairs, got {pair!r}")
            pairs.append((pair[0], pair[1]))
    else:
        raise OpMappingError(
            "op_mapping must be a dict (MAP form) or a list of pairs (ARRAY form), got "
            f"{type(mapping).__name__}"
        )
    if not pairs:
        raise OpMappingError("op_mapping is empty: leave it out to use the default mapping")
    return [(_side(key), _side(value)) for key, value in pairs]


def _side(side: object) -> tuple[str, ...]:
    if isinstance(side, str):
        items = [part.strip() for part in side.split(",")]
    elif isinstance(side, Sequence):
        items = []
        for element in side:
            if not isinstance(element, str):
                raise OpMappingError(f"op_mapping entries must be strings, got {element!r} in {side!r}")
            items.append(element.strip())
    else:
        raise OpMappingError(f"op_mapping entries must be strings or lists of strings, got {side!r}")
    if not items or any(not item for item in items):
        raise OpMappingError(f"op_mapping has an empty entry in {side!r}: remove the stray comma or blank")
    return tuple(items)


def _parse_kind_group(
    names: tuple[str, ...], *, side: str, function: str, seen: set[RowKind]
) -> frozenset[RowKind]:
    kinds: list[RowKind] = []
    for name in names:
        if name not in RowKind.__members__:
            hint = f" (did you mean '{name.upper()}'?)" if name.upper() in RowKind.__members__ else ""
            raise OpMappingError(
                f"op_mapping {side} '{name}' is not a row kind name{hint}: for {function} the {side} "
                f"side holds row kinds, one of {_KIND_NAMES} (rule: all row kind names must be valid)"
            )
        kind = RowKind[name]
        if kind in seen or kind in kinds:
            raise OpMappingError(
                f"op_mapping names {name} more than once (rule: each row kind at most once across all "
                "entries)"
            )
        kinds.append(kind)
    group = frozenset(kinds)
    if group not in VALID_GROUPINGS:
        raise OpMappingError(
            f"op_mapping groups {', '.join(names)} together, which is not a compatible grouping (rule: "
            "a group is a single row kind, or UPDATE_BEFORE, UPDATE_AFTER, or INSERT, UPDATE_AFTER, or "
            "INSERT, UPDATE_BEFORE, UPDATE_AFTER)"
        )
    seen.update(group)
    return group
