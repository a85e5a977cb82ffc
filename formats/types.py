"""The table schema model and its parser for Spark DDL strings (``"id INT NOT NULL, name STRING"``).

The parser reads Spark's type names and also Flink's spellings so that DDL copied from a Flink table
works: ``TIMESTAMP`` is Spark's instant (``TIMESTAMP_LTZ``), while Flink's ``TIMESTAMP(p)`` with a
precision is a local date-time (``TIMESTAMP_NTZ``), as Flink defines it. ``TIME`` has no Spark type
before 4.1 and is kept for Debezium's time columns.

A declared precision also tells how an integer is read for a temporal column (Debezium's adaptive
time precision): ``TIME(3)``/``TIMESTAMP_NTZ(3)`` count milliseconds, 4–6 microseconds, 7–9 nanoseconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from cdcflow.formats.errors import SchemaError


class TypeKind(Enum):
    BOOLEAN = "BOOLEAN"
    TINYINT = "TINYINT"
    SMALLINT = "SMALLINT"
    INT = "INT"
    BIGINT = "BIGINT"
    FLOAT = "FLOAT"
    DOUBLE = "DOUBLE"
    DECIMAL = "DECIMAL"
    STRING = "STRING"
    BINARY = "BINARY"
    DATE = "DATE"
    TIME = "TIME"
    TIMESTAMP_NTZ = "TIMESTAMP_NTZ"
    TIMESTAMP_LTZ = "TIMESTAMP"
    ARRAY = "ARRAY"
    MAP = "MAP"
    STRUCT = "STRUCT"


INTEGER_KINDS = frozenset({TypeKind.TINYINT, TypeKind.SMALLINT, TypeKind.INT, TypeKind.BIGINT})
INTEGER_RANGES = {
    TypeKind.TINYINT: (-(2**7), 2**7 - 1),
    TypeKind.SMALLINT: (-(2**15), 2**15 - 1),
    TypeKind.INT: (-(2**31), 2**31 - 1),
    TypeKind.BIGINT: (-(2**63), 2**63 - 1),
}

_INTEGER_ORDER = (TypeKind.TINYINT, TypeKind.SMALLINT, TypeKind.INT, TypeKind.BIGINT)


def widens(old: DataType, new: DataType) -> bool:
    """Whether ``new`` holds every value of ``old`` exactly and Delta can widen a column to it (its
    ``typeWidening`` feature): a larger integer, FLOAT to DOUBLE, a DECIMAL of more precision at the
    same scale."""
    if old.kind in INTEGER_KINDS and new.kind in INTEGER_KINDS:
        return _INTEGER_ORDER.index(new.kind) > _INTEGER_ORDER.index(old.kind)
    if old.kind is TypeKind.FLOAT:
        return new.kind is TypeKind.DOUBLE
    return (
        old.kind is TypeKind.DECIMAL
        and new.kind is TypeKind.DECIMAL
        and old.scale is not None
        and old.scale == new.scale
        and (new.precision or 0) > (old.precision or 0)
    )


@dataclass(frozen=True)
class DataType:
    """A column type. ``precision``/``scale`` for DECIMAL (scale None: Debezium's variable scale),
    ``precision`` (fractional digits) for TIME and timestamps; ``element``, ``key``/``value`` and
    ``fields`` for the nested types."""

    kind: TypeKind
    precision: int | None = None
    scale: int | None = None
    element: DataType | None = None
    key: DataType | None = None
    value: DataType | None = None
    fields: tuple[Field, ...] = ()

    def ddl(self) -> str:
        kind = self.kind
        if kind is TypeKind.DECIMAL:
            if self.scale is None:
                return "DECIMAL"
            return f"DECIMAL({self.precision}, {self.scale})"
        if kind in (TypeKind.TIME, TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ) and self.precision != 6:
            return f"{kind.value}({self.precision})"
        if kind is TypeKind.ARRAY:
            assert self.element is not None  # noqa: S101 - built with an element
            return f"ARRAY<{self.element.ddl()}>"
        if kind is TypeKind.MAP:
            assert self.key is not None and self.value is not None  # noqa: S101
            return f"MAP<{self.key.ddl()}, {self.value.ddl()}>"
        if kind is TypeKind.STRUCT:
            return "STRUCT<" + ", ".join(f.ddl(struct=True) for f in self.fields) + ">"
        return str(kind.value)


@dataclass(frozen=True)
class Field:
    name: str
    type: DataType
    nullable: bool = True

    def ddl(self, *, struct: bool = False) -> str:
        name: str = self.name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name) else f"`{self.name}`"
        text = f"{name}{':' if struct else ''} {self.type.ddl()}"
        return text if self.nullable else f"{text} NOT NULL"


@dataclass(frozen=True)
class Schema:
    """The columns of a table, in order."""

    fields: tuple[Field, ...]
    _by_name: dict[str, Field] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Field] = {}
        for column in self.fields:
            if column.name in by_name:
                raise SchemaError(f"column '{column.name}' is declared twice")
            by_name[column.name] = column
        object.__setattr__(self, "_by_name", by_name)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def field(self, name: str) -> Field:
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(f"no column '{name}'; the schema has {self.names}") from None

    def ddl(self) -> str:
        return ", ".join(f.ddl() for f in self.fields)

    def select(self, names: list[str] | tuple[str, ...]) -> Schema:
        return Schema(tuple(self.field(n) for n in names))


def atomic(kind: TypeKind, precision: int | None = None, scale: int | None = None) -> DataType:
    return DataType(kind, precision, scale)


STRING = atomic(TypeKind.STRING)
BIGINT = atomic(TypeKind.BIGINT)
INT = atomic(TypeKind.INT)
TIMESTAMP_LTZ_MILLIS = atomic(TypeKind.TIMESTAMP_LTZ, 3)


_SIMPLE_NAMES = {
    "BOOLEAN": TypeKind.BOOLEAN,
    "BOOL": TypeKind.BOOLEAN,
    "TINYINT": TypeKind.TINYINT,
    "BYTE": TypeKind.TINYINT,
    "SMALLINT": TypeKind.SMALLINT,
    "SHORT": TypeKind.SMALLINT,
    "INT": TypeKind.INT,
    "INTEGER": TypeKind.INT,
    "BIGINT": TypeKind.BIGINT,
    "LONG": TypeKind.BIGINT,
    "FLOAT": TypeKind.FLOAT,
    "REAL": TypeKind.FLOAT,
    "DOUBLE": TypeKind.DOUBLE,
    "STRING": TypeKind.STRING,
    "VARCHAR": TypeKind.STRING,
    "CHAR": TypeKind.STRING,
    "TEXT": TypeKind.STRING,
    "BINARY": TypeKind.BINARY,
    "VARBINARY": TypeKind.BINARY,
    "BYTES": TypeKind.BINARY,
    "DATE": TypeKind.DATE,
}
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')|(.))")


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, str, int]] = []
        for match in _TOKEN.finditer(text):
            quoted, word, number, literal, other = match.groups()
            if quoted is not None:
                self.items.append(("name", quoted[1:-1].replace("``", "`"), match.start()))
            elif word is not None:
                self.items.append(("word", word, match.start()))
            elif number is not None:
                self.items.append(("number", number, match.start()))
            elif literal is not None:
                self.items.append(("literal", literal, match.start()))
            elif other is not None and not other.isspace():
                self.items.append(("punct", other, match.start()))
        self.position = 0

    def peek(self) -> str | None:
        return self.items[self.position][1] if self.position < len(self.items) else None

    def peek_upper(self) -> str | None:
        token = self.peek()
        return token.upper() if token is not None else None

    def take(self) -> tuple[str, str]:
        if self.position >= len(self.items):
            raise self.error("unexpected end of the schema")
        kind, value, _ = self.items[self.position]
        self.position += 1
        return kind, value

    def expect(self, value: str) -> None:
        _, token = self.take()
        if token.upper() != value:
            self.position -= 1
            raise self.error(f"expected '{value}', found '{token}'")

    def accept(self, value: str) -> bool:
        if self.peek_upper() == value:
            self.position += 1
            return True
        return False

    def error(self, message: str) -> SchemaError:
        at = self.items[self.position][2] if self.position < len(self.items) else len(self.text)
        excerpt = self.text[max(0, at - 20) : at + 20]
        return SchemaError(
            f"cannot parse the schema at character {at} (...{excerpt}...): {message}. Write a Spark DDL "
            "string like 'id INT NOT NULL, name STRING, price DECIMAL(10, 2)'"
        )


def parse_ddl(text: str) -> Schema:
    """Parse ``"id INT NOT NULL, name STRING, ..."`` into a :class:`Schema`."""
    tokens = _Tokens(text)
    if tokens.peek() is None:
        raise SchemaError("the schema is empty: declare at least one column, e.g. 'id INT NOT NULL'")
    fields = [_field(tokens, struct=False)]
    while tokens.accept(","):
        fields.append(_field(tokens, struct=False))
    if tokens.peek() is not None:
        raise tokens.error(f"unexpected '{tokens.peek()}' after a column")
    return Schema(tuple(fields))


def _field(tokens: _Tokens, *, struct: bool) -> Field:
    kind, name = tokens.take()
    if kind not in ("word", "name"):
        tokens.position -= 1
        raise tokens.error(f"expected a column name, found '{name}'")
    if struct:
        tokens.accept(":")
    data_type = _type(tokens)
    nullable = True
    if tokens.accept("NOT"):
        tokens.expect("NULL")
        nullable = False
    elif tokens.accept("NULL"):
        nullable = True
    if tokens.accept("COMMENT"):
        literal_kind, _ = tokens.take()
        if literal_kind != "literal":
            tokens.position -= 1
            raise tokens.error("COMMENT needs a quoted string")
    return Field(name, data_type, nullable)


def _type(tokens: _Tokens) -> DataType:
    kind, word = tokens.take()
    if kind != "word":
        tokens.position -= 1
        raise tokens.error(f"expected a type name, found '{word}'")
    name = word.upper()
    if name in ("ARRAY", "MAP", "STRUCT", "ROW"):
        return _nested(tokens, name)
    params = _params(tokens)
    if name in ("DECIMAL", "DEC", "NUMERIC"):
        precision = params[0] if params else 10
        scale = params[1] if len(params) == 2 else 0
        if len(params) > 2 or not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise tokens.error("DECIMAL takes (precision, scale) with 1 <= precision <= 38, 0 <= scale <= it")
        return atomic(TypeKind.DECIMAL, precision, scale)
    if name in ("TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP_NTZ", "TIME"):
        if tokens.accept("WITH") or tokens.accept("WITHOUT"):
            raise tokens.error("write TIMESTAMP_LTZ / TIMESTAMP_NTZ instead of WITH(OUT) TIME ZONE")
        precision = _precision(tokens, params)
        if name == "TIME":
            return atomic(TypeKind.TIME, precision)
        local = name == "TIMESTAMP_NTZ" or (name == "TIMESTAMP" and params)
        return atomic(TypeKind.TIMESTAMP_NTZ if local else TypeKind.TIMESTAMP_LTZ, precision)
    simple = _SIMPLE_NAMES.get(name)
    if simple is None:
        raise tokens.error(
            f"unknown type '{word}'; known: {', '.join(sorted(_SIMPLE_NAMES))}, DECIMAL(p, s), TIME(p), "
            "TIMESTAMP, TIMESTAMP_NTZ, TIMESTAMP_LTZ, ARRAY<T>, MAP<K, V>, STRUCT<name: T, ...>"
        )
    if params and simple not in (TypeKind.STRING, TypeKind.BINARY):
        raise tokens.error(f"{name} takes no parameters")
    return atomic(simple)


def _precision(tokens: _Tokens, params: list[int]) -> int:
    if not params:
        return 6
    if len(params) != 1 or not 0 <= params[0] <= 9:
        raise tokens.error("a time precision is one number from 0 to 9")
    return params[0]


def _params(tokens: _Tokens) -> list[int]:
    if not tokens.accept("("):
        return []
    params = []
    while True:
        kind, value = tokens.take()
        if kind != "number":
            tokens.position -= 1
            raise tokens.error(f"expected a number, found '{value}'")
        params.append(int(value))
        if tokens.accept(")"):
            return params
        tokens.expect(",")


def _nested(tokens: _Tokens, name: str) -> DataType:
    tokens.expect("<")
    if name == "ARRAY":
        result = DataType(TypeKind.ARRAY, element=_type(tokens))
    elif name == "MAP":
        key = _type(tokens)
        tokens.expect(",")
        result = DataType(TypeKind.MAP, key=key, value=_type(tokens))
    else:
        fields = [_field(tokens, struct=True)]
        while tokens.accept(","):
            fields.append(_field(tokens, struct=True))
        result = DataType(TypeKind.STRUCT, fields=tuple(fields))
    tokens.expect(">")
    return result
