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
arrival order. Other connectors, and a source block without the fields, give null (never late).
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
    if isinstance(sequence, str | list):
        parts = orjson.loads(sequence) if isinstance(sequence, str) else sequence
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
    parts = _lsn(commit)
    parts += _lsn(change) if isinstance(change, str) else [0, 0, 0]
    return [*parts, int(source.get("event_serial_no") or 0)]


def _lsn(text: str) -> list[int]:
    """A SQL Server LSN (``00000025:00000d98:0002``) as its three numbers."""
    parts = [int(part, 16) for part in text.split(":")]
    if len(parts) != 3:
        raise ValueError(f"not a SQL Server LSN: {text!r}")
    return parts


def _oracle(source: Mapping[str, Any]) -> list[int] | None:
    scn = source.get("scn")
    if scn is None:
        return None
    commit = source.get("commit_scn")
    return [int(commit) if commit is not None else int(scn), int(scn)]
