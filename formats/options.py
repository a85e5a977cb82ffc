"""Format options: declared once (key, type, default, description), parsed once on the driver.

Keys are Flink's (``debezium-json.schema-include``); the format prefix is optional, keys are
case-insensitive (Spark lower-cases them) and values are strings, as Spark and Flink pass them.
Unknown keys and malformed values fail before any record is read, listing what is valid.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from cdcflow.formats.errors import FormatOptionError
from cdcflow.formats.redact import redact

T = TypeVar("T")
E = TypeVar("E", bound=Enum)


@dataclass(frozen=True)
class Option(Generic[T]):
    key: str
    parse: Callable[[str], T]
    default: T
    description: str

    def describe(self, prefix: str) -> str:
        return f"{prefix}.{self.key} (default {show_default(self.default)}): {self.description}"


def show_default(value: object) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, re.Pattern):
        return str(value.pattern)
    if value is None or value == ():
        return "none"
    if isinstance(value, tuple):
        return ", ".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError(f"'{text}' is not a boolean: write true or false")


def integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"'{text}' is not an integer") from None


def regex(text: str) -> re.Pattern[str] | None:
    if not text:
        return None
    try:
        return re.compile(text)
    except re.error as error:
        raise ValueError(f"'{text}' is not a valid regular expression ({error})") from None


def optional_string(text: str) -> str | None:
    return text or None


def names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def choice(enum: type[E]) -> Callable[[str], E]:
    def parse(text: str) -> E:
        wanted = text.strip().upper().replace("_", "-")
        for member in enum:
            if str(member.value).upper().replace("_", "-") == wanted:
                return member
        valid = ", ".join(str(m.value) for m in enum)
        raise ValueError(f"'{text}' is not one of {valid}")

    return parse


class OptionSet:
    """The options of one format, under its prefix (``debezium-json``)."""

    def __init__(self, prefix: str, options: Sequence[Option[Any]]) -> None:
        self.prefix = prefix
        self.options = {option.key: option for option in options}

    def parse(self, raw: Mapping[str, str]) -> dict[str, Any]:
        """Return every option's value (defaults filled in); fail on unknown or malformed ones."""
        values = {key: option.default for key, option in self.options.items()}
        unknown = []
        for given_key, text in raw.items():
            key = self.strip_prefix(given_key)
            option = self.options.get(key) if key is not None else None
            if key is None or option is None:
                unknown.append(given_key)
                continue
            try:
                values[key] = option.parse(str(text))
            except ValueError as error:
                raise FormatOptionError(
                    f"option '{self.prefix}.{key}': {redact(str(error), [(key, text)])}. "
                    f"{option.describe(self.prefix)}"
                ) from None
        if unknown:
            raise FormatOptionError(
                f"Unsupported options for format '{self.prefix}': {', '.join(sorted(unknown))}. "
                f"Supported options: {', '.join(self.keys())}"
            )
        return values

    def strip_prefix(self, given_key: str) -> str | None:
        key = given_key.strip().lower()
        prefix = self.prefix + "."
        if key.startswith(prefix):
            key = key[len(prefix) :]
        return key if key in self.options else None

    def accepts(self, key: str, text: str) -> bool:
        """Whether the format has option ``key`` and it takes the value ``text``."""
        option = self.options.get(key)
        if option is None:
            return False
        try:
            option.parse(text)
        except ValueError:
            return False
        return True

    def owns(self, given_key: str) -> bool:
        return self.strip_prefix(given_key) is not None

    def keys(self) -> list[str]:
        return [f"{self.prefix}.{key}" for key in self.options]

    def markdown(self) -> str:
        """The options as a Markdown table (docs/formats.md is checked against it)."""
        rows = [
            f"| `{key}` | `{show_default(o.default)}` | {o.description} |" for key, o in self.options.items()
        ]
        return "\n".join(["| option | default | meaning |", "|---|---|---|", *rows])
