"""The position of a Debezium change in its database's log, as a sortable tuple of integers.

Debezium names the position differently for each connector; ``source.sequence`` turns it into one
ARRAY<BIGINT> that orders the changes of one row the way the database committed them:

- PostgreSQL: ``sequence`` (``["<last commit lsn>", "<lsn>"]``), else ``[lsn]``;
- MySQL / MariaDB: ``[binlog file number, pos, row]``;
- SQL Server: the three parts of ``commit_lsn``, then of ``change_lsn``, then ``event_serial_no``;
- Oracle: ``[commit_scn, scn]`` (``commit_scn`` when present).

Snapshot reads share one position, so ties keep their arrival order. Other connectors give null.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

_DIGITS = re.compile(r"(\d+)$")


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
    except (ValueError, TypeError, orjson.JSONDecodeError):
        return None
    return None


def _postgres(source: Mapping[str, Any]) -> list[int] | None:
    sequence = source.get("sequence")
    if isinstance(sequence, str):
        parts = orjson.loads(sequence)
        if isinstance(parts, list) and len(parts) == 2:
            return [int(part) if part is not None else 0 for part in parts]
    lsn = source.get("lsn")
    return [int(lsn)] if lsn is not None else None


def _mysql(source: Mapping[str, Any]) -> list[int] | None:
    file_name, pos = source.get("file"), source.get("pos")
    if not isinstance(file_name, str) or pos is None:
        return None
    number = _DIGITS.search(file_name)
    return [int(number.group(1)) if number else 0, int(pos), int(source.get("row") or 0)]


def _sqlserver(source: Mapping[str, Any]) -> list[int] | None:
    commit, change = source.get("commit_lsn"), source.get("change_lsn")
    if not isinstance(commit, str):
        return None
    parts = [int(part, 16) for part in commit.split(":")]
    if isinstance(change, str):
        parts += [int(part, 16) for part in change.split(":")]
    return [*parts, int(source.get("event_serial_no") or 0)]


def _oracle(source: Mapping[str, Any]) -> list[int] | None:
    scn = source.get("scn")
    if scn is None:
        return None
    commit = source.get("commit_scn")
    return [int(commit) if commit is not None else int(scn), int(scn)]
