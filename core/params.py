"""The parameters of FROM_CHANGELOG and TO_CHANGELOG, validated once ("planning time").

Names follow the spec: where it writes ``DESCRIPTOR(x)`` we take the field name ``"x"``, where it
writes ``MAP[...]`` a dict, where it writes an ``INTERVAL`` a :class:`datetime.timedelta`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import TypedDict, Unpack

from cdcflow.core.errors import ChangelogValidationError
from cdcflow.core.opmapping import (
    FromOpMapping,
    OpMappingInput,
    ToOpMapping,
    parse_from_op_mapping,
    parse_to_op_mapping,
)
from cdcflow.core.rowkind import INS, UA, UB, ChangelogMode


class InvalidOpHandling(Enum):
    """What from_changelog does with an operation code that ``op_mapping`` does not know."""

    FAIL = "FAIL"
    LOG = "LOG"
    SKIP = "SKIP"

    @classmethod
    def parse(cls, value: str | InvalidOpHandling) -> InvalidOpHandling:
        if isinstance(value, InvalidOpHandling):
            return value
        try:
            return cls(str(value).strip().upper())
        except ValueError:
            raise ChangelogValidationError(
                f"invalid_op_handling '{value}' is not valid: use one of {', '.join(m.value for m in cls)}"
            ) from None


Columns = str | Sequence[str]
TtlInput = timedelta | int | float


class FromChangelogArgs(TypedDict, total=False):
    """FROM_CHANGELOG's parameters (spec 4.1), declared once: the engine (``cdcflow.from_changelog``),
    the DataFrame API (``cdcflow.spark.from_changelog``) and the SQL function take exactly these; the
    defaults are :func:`plan_from_changelog`'s."""

    op: str
    before: str | None
    after: str | None
    op_mapping: OpMappingInput | None
    invalid_op_handling: str | InvalidOpHandling
    partition_by: Columns | None
    order_by: str | None
    state_ttl: TtlInput | None
    consume_full_deletes: bool
    passthrough: Columns | None
    uid: str | None


class ToChangelogArgs(TypedDict, total=False):
    """TO_CHANGELOG's parameters (spec 4.2), declared once as :class:`FromChangelogArgs`."""

    op: str
    before: str | None
    after: str | None
    op_mapping: OpMappingInput | None
    partition_by: Columns | None
    on_time: str | None
    state_ttl: TtlInput | None
    produces_full_deletes: bool
    passthrough: Columns | None
    uid: str | None


FROM_CHANGELOG_ARGUMENTS: tuple[str, ...] = tuple(FromChangelogArgs.__annotations__)
TO_CHANGELOG_ARGUMENTS: tuple[str, ...] = tuple(ToChangelogArgs.__annotations__)


def _known(function: str, args: Mapping[str, object], names: tuple[str, ...]) -> None:
    """Python's own error for a keyword the function does not take (``**args`` would accept it)."""
    for name in args:
        if name not in names:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


@dataclass(frozen=True)
class FromChangelogParams:
    op: str = "op"
    before: str | None = None
    after: str | None = None
    op_mapping: FromOpMapping = parse_from_op_mapping(None)
    invalid_op_handling: InvalidOpHandling = InvalidOpHandling.FAIL
    partition_by: tuple[str, ...] = ()
    order_by: str | None = None
    state_ttl_seconds: float | None = None
    consume_full_deletes: bool = False
    passthrough: tuple[str, ...] = ()
    uid: str | None = None

    @property
    def nested(self) -> bool:
        """Images come from ``before`` / ``after`` fields rather than the flat record."""
        return self.before is not None or self.after is not None

    @property
    def has_before_image(self) -> bool:
        """The input carries a before image distinct from the after image."""
        return self.before is not None and self.before != self.after

    @property
    def stateful(self) -> bool:
        return self.state_ttl_seconds is not None

    @property
    def output_mode(self) -> ChangelogMode:
        return ChangelogMode(self.op_mapping.output_kinds, key_only_deletes=not self.consume_full_deletes)


@dataclass(frozen=True)
class ToChangelogParams:
    op: str = "op"
    before: str | None = None
    after: str | None = None
    op_mapping: ToOpMapping = parse_to_op_mapping(None)
    partition_by: tuple[str, ...] = ()
    on_time: str | None = None
    state_ttl_seconds: float | None = None
    produces_full_deletes: bool = False
    passthrough: tuple[str, ...] = ()
    uid: str | None = None

    @property
    def nested(self) -> bool:
        return self.before is not None or self.after is not None

    @property
    def keeps_images(self) -> bool:
        """Remember each key's last image, to fill ``before`` of an upsert or a partial delete."""
        return self.state_ttl_seconds is not None and bool(self.partition_by)


def plan_from_changelog(**args: Unpack[FromChangelogArgs]) -> FromChangelogParams:
    """Validate FROM_CHANGELOG parameters (spec 4.1) and return them frozen."""
    _known("from_changelog", args, FROM_CHANGELOG_ARGUMENTS)
    params = FromChangelogParams(
        op=_field_name("op", args.get("op", "op")),
        before=_optional_field_name("before", args.get("before")),
        after=_optional_field_name("after", args.get("after")),
        op_mapping=parse_from_op_mapping(args.get("op_mapping")),
        invalid_op_handling=InvalidOpHandling.parse(args.get("invalid_op_handling", InvalidOpHandling.FAIL)),
        partition_by=_columns("partition_by", args.get("partition_by")),
        order_by=_optional_field_name("order_by", args.get("order_by")),
        state_ttl_seconds=_ttl_seconds(args.get("state_ttl")),
        consume_full_deletes=_flag("consume_full_deletes", args.get("consume_full_deletes", False)),
        passthrough=_columns("passthrough", args.get("passthrough")),
        uid=_uid(args.get("uid")),
    )
    _check_envelope_names(params.op, params.before, params.after, params.passthrough)
    groups = set(params.op_mapping.groups.values())
    needs_key_state = [g for g in groups if INS in g and UA in g]
    derives_before = [g for g in groups if UB in g and UA in g] and not params.has_before_image
    if needs_key_state and not params.stateful:
        raise ChangelogValidationError(
            "op_mapping maps one code to INSERT and UPDATE_AFTER, so from_changelog must remember which "
            "keys it has seen: set state_ttl (timedelta(0) keeps state forever) and partition_by"
        )
    if derives_before and not params.stateful:
        raise ChangelogValidationError(
            "op_mapping maps a code to UPDATE_BEFORE, UPDATE_AFTER but the input has no separate before "
            "image, so the -U row must come from state: set state_ttl (timedelta(0) keeps state "
            "forever) and partition_by, or name the before field with before='...'"
        )
    if params.stateful and not params.partition_by:
        raise ChangelogValidationError(
            "state_ttl keeps state per key, so from_changelog needs the key: set partition_by to the "
            "upsert key column(s)"
        )
    return params


def plan_to_changelog(**args: Unpack[ToChangelogArgs]) -> ToChangelogParams:
    """Validate TO_CHANGELOG parameters (spec 4.2) and return them frozen."""
    _known("to_changelog", args, TO_CHANGELOG_ARGUMENTS)
    params = ToChangelogParams(
        op=_field_name("op", args.get("op", "op")),
        before=_optional_field_name("before", args.get("before")),
        after=_optional_field_name("after", args.get("after")),
        op_mapping=parse_to_op_mapping(args.get("op_mapping")),
        partition_by=_columns("partition_by", args.get("partition_by")),
        on_time=_optional_field_name("on_time", args.get("on_time")),
        state_ttl_seconds=_ttl_seconds(args.get("state_ttl")),
        produces_full_deletes=_flag("produces_full_deletes", args.get("produces_full_deletes", False)),
        passthrough=_columns("passthrough", args.get("passthrough")),
        uid=_uid(args.get("uid")),
    )
    _check_envelope_names(params.op, params.before, params.after, params.passthrough)
    if params.op in params.passthrough:
        raise ChangelogValidationError(
            f"passthrough names '{params.op}', the output's op field: passthrough fields must differ "
            "from op, before and after"
        )
    return params


def _check_envelope_names(
    op: str, before: str | None, after: str | None, passthrough: tuple[str, ...]
) -> None:
    for name, value in (("before", before), ("after", after)):
        if value is not None and value == op:
            raise ChangelogValidationError(
                f"{name} and op both name the field '{op}': the operation code and the {name} image "
                "need fields of their own"
            )
    images = {v for v in (before, after) if v is not None}
    clash = images.intersection(passthrough)
    if clash:
        raise ChangelogValidationError(
            f"passthrough names the image field(s) {sorted(clash)}: passthrough forwards top-level "
            "envelope fields next to the images, so it must not name before or after"
        )
    if len(set(passthrough)) != len(passthrough):
        raise ChangelogValidationError(f"passthrough lists a field twice: {list(passthrough)}")


def _field_name(param: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ChangelogValidationError(f"{param} must be a non-empty field name, got {value!r}")
    return value


def _optional_field_name(param: str, value: object) -> str | None:
    return None if value is None else _field_name(param, value)


def _columns(param: str, value: Columns | None) -> tuple[str, ...]:
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else list(value)
    return tuple(_field_name(param, name) for name in names)


def _ttl_seconds(value: TtlInput | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (timedelta, int, float)):
        raise ChangelogValidationError(
            f"state_ttl must be a timedelta (or seconds), got {value!r}; timedelta(0) keeps state forever"
        )
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ChangelogValidationError(f"state_ttl must not be negative, got {value!r}")
    return seconds


def _flag(param: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ChangelogValidationError(f"{param} must be True or False, got {value!r}")
    return value


def _uid(value: object) -> str | None:
    if value is None:
        return None
    return _field_name("uid", value)
