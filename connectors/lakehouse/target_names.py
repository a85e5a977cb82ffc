"""A whole-database job's ``--target``: a path with placeholders each source table fills in.

``/lake/{db}/{table}``, ``s3://bucket/{schema}_{table}``: ``{db}``, ``{schema}``, ``{table}`` come from
the envelope (:meth:`FormatFactory.source_table`), ``{topic}`` from the topic (or the recorded file).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

from cdcflow.connectors.errors import ConnectorOptionError

PLACEHOLDERS = ("db", "schema", "table", "topic")
_UNSAFE = re.compile(r"[/\\:*?\"<>|\s]")


def placeholders(target: str) -> tuple[str, ...]:
    """The placeholders ``target`` holds; an unknown one or a format spec is an error."""
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(target)]
    except ValueError as error:
        raise ConnectorOptionError(
            f"--target {target!r}: {error} (write a literal brace as {{{{ or }}}})"
        ) from None
    found = []
    for name, spec, conversion in fields:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            raise ConnectorOptionError(
                f"--target {target!r}: unknown placeholder {{{name}}}; a whole-database target takes "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
            )
        found.append(name)
    return tuple(dict.fromkeys(found))


def is_database_target(target: str) -> bool:
    """Whether ``target`` routes each source table to a table of its own (it holds a placeholder)."""
    return bool(placeholders(target))


def render(target: str, values: Mapping[str, str | None], table: str) -> str:
    """``target`` with each placeholder replaced by its value, made safe for a path segment; a
    placeholder ``table`` (a qualified name) has no value for is an error."""
    missing = [name for name in placeholders(target) if not values.get(name)]
    if missing:
        raise ConnectorOptionError(
            f"--target {target!r}: table {table} has no {', '.join('{' + m + '}' for m in missing)} (its "
            "messages do not name one): leave the placeholder out or use {table} and {topic}"
        )
    return target.format(**{name: _UNSAFE.sub("_", str(values.get(name) or "")) for name in PLACEHOLDERS})
