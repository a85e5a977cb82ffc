"""The position of a Debezium change in its database's log, as a sortable tuple of integers.

Debezium names the position differently for each connector; ``source.sequence`` turns it into one
ARRAY<BIGINT> that orders the changes of one row the way the database committed them:

- PostgreSQL: ``sequence`` (``["<last commit lsn>", "<lsn>"]``, a null part as 0), else ``[lsn]``;
- MySQL / MariaDB: ``[binlog file number, pos, row]``;
- SQL Server: the three parts of ``commit_lsn``, then of ``change_lsn`` (zeros on snapshot reads,
  which have none, so every position has the same seven parts), then ``event_serial_no``;
- Oracle: ``[commit_scn, scn]`` (``scn`` twice when there is no ``commit_scn``).

A position orders the changes of one log: it restarts when the log does (MySQL ``RESET MASTER`` or
a failover to a server with its own binlog files, a new PostgreSQL cluster, a restored or recreated
SQL Server or Oracle database). The applier tells such a restart from a late change by the commit
time (``source.timestamp``, ``restart_by``). Snapshot reads share one position, so ties keep their
arrival order. Other connectors, and a source block without the fields or with one that is not a
number, give null (never late). A number beyond BIGINT, or true/false where a number belongs, fails the
record (a :class:`FieldError` naming the source field): no BIGINT holds it, and null would put the change
out of order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from cdcflow.formats.errors import FieldError, excerpt
from cdcflow.formats.types import INTEGER_RANGES, TypeKind

_FILE_NUMBER = re.compile(r"([0-9]+)$")
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
_LOW, _HIGH = INTEGER_RANGES[TypeKind.BIGINT]
#: Digits beyond which a part is out of BIGINT's range whatever they are (no quadratic int() needed).
_MAX_DIGITS = {10: 19, 16: 16}
_PART = r'null|"[0-9]{1,18}"|[0-9]{1,18}'
#: ``sequence`` as Debezium writes it, ``["<last commit lsn>","<lsn>"]``: the form the columnar path reads
#: vectorised (as RE2 reads this pattern); other text is read as JSON.
POSTGRES_SEQUENCE = re.compile(rf"^\[(?P<a>{_PART}),(?P<b>{_PART})\]$")


def source_sequence(source: Mapping[str, Any]) -> list[int] | None:
    connector = source.get("connector")
    try:
        if connector == "postgresql":
            return _postgres(source)
        if connector in ("mysql", "mariadb"):
            return _mysql(source)
        if connector == "sqlserver":
            return _sqlserver(source)
        if connector == "oracle":
            return _oracle(source)
    except FieldError:
        raise
    except (ValueError, TypeError, orjson.JSONDecodeError):  # not a position: no order to keep
        return None
    return None


def source_lsn(source: Mapping[str, Any]) -> int | None:
    """``source.lsn`` (PostgreSQL's log sequence number): null unless an integer; one beyond BIGINT, or
    true/false, fails the record."""
    lsn = source.get("lsn")
    if lsn is True or lsn is False:
        raise _not_a_number("lsn", lsn)
    return _in_range(lsn, "lsn") if isinstance(lsn, int) else None


def part(value: Any, field: str, base: int = 10) -> int:
    """One integer of a position, from a JSON number or text (Debezium writes some parts as text);
    ValueError if it is none, a :class:`FieldError` naming ``source.<field>`` beyond BIGINT."""
    if value is True or value is False:
        raise _not_a_number(field, value)
    if isinstance(value, str):
        text = value.strip()
        if not (_HEX if base == 16 else _DECIMAL).fullmatch(text):
            raise ValueError(value)
        if len(text.lstrip("+-0")) > _MAX_DIGITS[base]:
            raise _beyond_bigint(field, value)
        return _in_range(int(text, base), field)
    if isinstance(value, int):
        return _in_range(value, field)
    if isinstance(value, float) and value.is_integer():
        return _in_range(int(value), field)
    raise ValueError(value)


def _in_range(number: int, field: str) -> int:
    if not _LOW <= number <= _HIGH:
        raise _beyond_bigint(field, number)
    return number


def _beyond_bigint(field: str, value: Any) -> FieldError:
    return FieldError(
        f"source.{field}",
        f"{excerpt(value)} is beyond BIGINT, the type of the metadata columns source.sequence and "
        "source.lsn: fix the producer, or do not request these columns for this source",
    )


def _not_a_number(field: str, value: Any) -> FieldError:
    return FieldError(
        f"source.{field}",
        f"a log position is a number, got {str(value).lower()}: fix the producer, or do not request the "
        "metadata columns source.sequence and source.lsn for this source",
    )


def _postgres(source: Mapping[str, Any]) -> list[int] | None:
    parts = source.get("sequence")
    if isinstance(parts, str):
        matched = POSTGRES_SEQUENCE.fullmatch(parts)
        parts = [_sequence_part(text) for text in matched.groups()] if matched else orjson.loads(parts)
    if isinstance(parts, list) and len(parts) == 2:
        return [part(item, "sequence") if item is not None else 0 for item in parts]
    lsn = source.get("lsn")
    return [part(lsn, "lsn")] if lsn is not None else None


def _sequence_part(text: str) -> str | None:
    return None if text == "null" else text.strip('"')


def _mysql(source: Mapping[str, Any]) -> list[int] | None:
    file_name, pos = source.get("file"), source.get("pos")
    if not isinstance(file_name, str) or pos is None:
        return None
    number = _FILE_NUMBER.search(file_name)
    return [
        part(number.group(1), "file") if number else 0,
        part(pos, "pos"),
        part(source.get("row") or 0, "row"),
    ]


def _sqlserver(source: Mapping[str, Any]) -> list[int] | None:
    commit, change = source.get("commit_lsn"), source.get("change_lsn")
    if not isinstance(commit, str):
        return None
    parts = _lsn(commit, "commit_lsn")
    parts += _lsn(change, "change_lsn") if isinstance(change, str) else [0, 0, 0]
    return [*parts, part(source.get("event_serial_no") or 0, "event_serial_no")]


def _lsn(text: str, field: str) -> list[int]:
    """A SQL Server LSN (``00000025:00000d98:0002``) as its three numbers."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"not a SQL Server LSN: {text!r}")
    return [part(item, field, 16) for item in parts]


def _oracle(source: Mapping[str, Any]) -> list[int] | None:
    scn = source.get("scn")
    if scn is None:
        return None
    commit = source.get("commit_scn")
    return [part(commit, "commit_scn") if commit is not None else part(scn, "scn"), part(scn, "scn")]
