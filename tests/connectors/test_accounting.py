"""The counts files of committed micro-batches are rolled up into ``totals.json`` and deleted, without
losing or double counting a message (docs/connectors.md, "Bad records"). Spark is simulated: counts
files and a ``commits`` directory with chosen modification times."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from cdcflow.connectors.spark import accounting
from cdcflow.connectors.spark.accounting import CountsSince, MessageCounts, read_counts, roll_up, write_counts
from cdcflow.formats import FormatMetrics

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND


def _set_time(path: Path, stamp: int) -> None:
    os.utime(path, ns=(stamp, stamp))


def _file(directory: Path, name: str, read: int, stamp: int) -> Path:
    """A range's counts file, written at ``stamp``: ``read`` messages, all with changes."""
    write_counts(str(directory), name, MessageCounts(read=read, changed=read, changes=read))
    path = directory / f"counts-{name}.json"
    _set_time(path, stamp)
    return path


def _commit(checkpoint: Path, batch: int, stamp: int) -> None:
    commits = checkpoint / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    (commits / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (commits / f".{batch}.crc").write_bytes(b"crc")
    _set_time(commits / str(batch), stamp)


def _names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    checkpoint = tmp_path / "checkpoint"
    return checkpoint / "cdcflow-accounting", checkpoint


def test_committed_files_are_rolled_up_and_deleted(dirs: tuple[Path, Path]) -> None:
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0 + 1 * SECOND)  # batch 0
    _commit(checkpoint, 0, T0 + 2 * SECOND)
    _file(directory, "t-0-10-30", 20, T0 + 3 * SECOND)  # batch 1
    _file(directory, "t-1-0-5", 5, T0 + 3 * SECOND)
    _commit(checkpoint, 1, T0 + 4 * SECOND)
    _file(directory, "t-0-30-100", 70, T0 + 5 * SECOND)  # batch 2, not committed

    rolled = roll_up(str(directory), str(checkpoint))

    assert sorted(rolled) == ["counts-t-0-0-10.json", "counts-t-0-10-30.json", "counts-t-1-0-5.json"]
    assert _names(directory) == {"totals.json", "counts-t-0-30-100.json"}
    totals = orjson.loads((directory / "totals.json").read_bytes())
    assert (totals["read"], totals["changed"], totals["changes"], totals["dead_letters"]) == (35, 35, 35, 0)
    assert read_counts(str(directory)).read == 105

    _commit(checkpoint, 2, T0 + 6 * SECOND)
    _file(directory, "t-1-5-6", 1, T0 + 7 * SECOND)  # batch 3, not committed
    assert sorted(roll_up(str(directory), str(checkpoint))) == ["counts-t-0-30-100.json"]
    assert _names(directory) == {"totals.json", "counts-t-1-5-6.json"}
    assert orjson.loads((directory / "totals.json").read_bytes())["read"] == 105
    assert read_counts(str(directory)).read == 106


def test_nothing_is_rolled_up_without_a_commit(dirs: tuple[Path, Path]) -> None:
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0)
    assert roll_up(str(directory), str(checkpoint)) == {}
    assert _names(directory) == {"counts-t-0-0-10.json"}
    _commit(checkpoint, 0, T0 + 1)
    missing = checkpoint / "no-accounting"
    assert roll_up(str(missing), str(checkpoint)) == {}
    assert not missing.exists()


def test_a_file_of_the_commit_files_clock_tick_waits_for_the_next_commit(dirs: tuple[Path, Path]) -> None:
    """It may belong to the next batch, which rewrites it if it runs again: rolling it up now could
    count it twice."""
    directory, checkpoint = dirs
    _commit(checkpoint, 0, T0)
    _file(directory, "t-0-0-10", 10, T0)
    assert roll_up(str(directory), str(checkpoint)) == {}
    assert _names(directory) == {"counts-t-0-0-10.json"}
    _commit(checkpoint, 1, T0 + 1)
    assert sorted(roll_up(str(directory), str(checkpoint))) == ["counts-t-0-0-10.json"]
    assert read_counts(str(directory)).read == 10


def test_an_uncommitted_batch_run_again_is_counted_once(dirs: tuple[Path, Path]) -> None:
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0 + 1 * SECOND)
    _commit(checkpoint, 0, T0 + 2 * SECOND)
    _file(directory, "t-0-10-20", 10, T0 + 3 * SECOND)  # batch 1: the query stops before its commit
    roll_up(str(directory), str(checkpoint))
    _file(directory, "t-0-10-20", 10, T0 + 4 * SECOND)  # batch 1 again, after the restart
    _commit(checkpoint, 1, T0 + 5 * SECOND)
    roll_up(str(directory), str(checkpoint))
    assert _names(directory) == {"totals.json"}
    assert read_counts(str(directory)).read == 20


def test_a_roll_up_stopped_before_its_deletes_does_not_count_twice(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0 + 1 * SECOND)
    _commit(checkpoint, 0, T0 + 2 * SECOND)
    roll_up(str(directory), str(checkpoint))
    _file(directory, "t-0-10-30", 20, T0 + 3 * SECOND)
    _file(directory, "t-1-0-5", 5, T0 + 3 * SECOND)
    _commit(checkpoint, 1, T0 + 4 * SECOND)

    def crash(path: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(accounting, "_remove", crash)
    with pytest.raises(KeyboardInterrupt):
        roll_up(str(directory), str(checkpoint))
    monkeypatch.undo()
    assert orjson.loads((directory / "totals.json").read_bytes())["read"] == 35
    assert "counts-t-0-10-30.json" in _names(directory)
    assert read_counts(str(directory)).read == 35  # the totals and the files left behind, once

    since = CountsSince(str(directory), str(checkpoint))
    assert _names(directory) == {"totals.json"}
    assert read_counts(str(directory)).read == 35
    assert since.counts() == MessageCounts()
    _file(directory, "t-0-30-40", 10, T0 + 5 * SECOND)
    _commit(checkpoint, 2, T0 + 6 * SECOND)
    roll_up(str(directory), str(checkpoint))
    assert read_counts(str(directory)).read == 45


def test_stale_temporary_files_are_deleted(dirs: tuple[Path, Path]) -> None:
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0 + 1 * SECOND)
    old = directory / ".counts-t-0-0-10.attempt-0-abc.tmp"
    new = directory / ".counts-t-0-10-20.attempt-0-def.tmp"
    for path, stamp in ((old, T0 + 1 * SECOND), (new, T0 + 3 * SECOND)):
        path.write_bytes(b"{")
        _set_time(path, stamp)
    _commit(checkpoint, 0, T0 + 2 * SECOND)
    roll_up(str(directory), str(checkpoint))
    assert _names(directory) == {"totals.json", new.name}


def test_counts_since_are_what_the_run_read(dirs: tuple[Path, Path]) -> None:
    """Before and after roll-ups: files of earlier runs never count, a file the run rewrites does."""
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0 + 1 * SECOND)  # an earlier run, committed
    _commit(checkpoint, 0, T0 + 2 * SECOND)
    _file(directory, "t-0-10-30", 20, T0 + 3 * SECOND)  # an earlier run, not committed: run again
    _file(directory, "t-1-0-5", 5, T0 + 3 * SECOND)  # an earlier run, not committed: not run again

    since = CountsSince(str(directory), str(checkpoint))
    assert _names(directory) == {"totals.json", "counts-t-0-10-30.json", "counts-t-1-0-5.json"}
    assert since.counts() == MessageCounts()

    _file(directory, "t-0-10-30", 20, T0 + 4 * SECOND)  # batch 1 run again
    _file(directory, "t-0-30-31", 1, T0 + 4 * SECOND)
    assert since.counts().read == 21
    _commit(checkpoint, 1, T0 + 5 * SECOND)
    assert since.counts().read == 21  # rolled up now, and still counted
    assert _names(directory) == {"totals.json"}
    _file(directory, "t-0-31-40", 9, T0 + 6 * SECOND)
    assert since.counts().read == 30
    _commit(checkpoint, 2, T0 + 7 * SECOND)
    assert since.counts().read == 30
    assert read_counts(str(directory)).read == 45

    later = CountsSince(str(directory), str(checkpoint))
    assert later.counts() == MessageCounts()


def test_counts_since_without_a_checkpoint_never_rolls_up(dirs: tuple[Path, Path]) -> None:
    directory, checkpoint = dirs
    _file(directory, "t-0-0-10", 10, T0 + 1 * SECOND)
    _commit(checkpoint, 0, T0 + 2 * SECOND)
    since = CountsSince(str(directory))
    _file(directory, "t-0-10-20", 10, T0 + 3 * SECOND)
    _commit(checkpoint, 1, T0 + 4 * SECOND)
    assert since.counts().read == 10
    assert _names(directory) == {"counts-t-0-0-10.json", "counts-t-0-10-20.json"}


def test_roll_up_work_stays_bounded_by_the_files_left(dirs: tuple[Path, Path]) -> None:
    """A long run leaves only the files of batches not yet committed, however many batches ran."""
    directory, checkpoint = dirs
    since = CountsSince(str(directory), str(checkpoint))
    for batch in range(50):
        stamp = T0 + 2 * batch * SECOND
        for partition in range(4):
            _file(directory, f"t-{partition}-{batch}-{batch + 1}", 1, stamp)
        _commit(checkpoint, batch, stamp + SECOND)
        assert since.counts().read == 4 * (batch + 1)
        assert len(_names(directory)) == 1  # totals.json
    assert read_counts(str(directory)).read == 200


def test_internal_errors_reach_the_counts_files_and_their_summary(tmp_path: Path) -> None:
    metrics = FormatMetrics(messages=3, changed_messages=1, dead_letters=2, internal_errors=1)
    write_counts(str(tmp_path), "t-0-0-3", MessageCounts.of(metrics))
    counts = read_counts(str(tmp_path))
    assert (counts.read, counts.dead_letters, counts.internal_errors) == (3, 2, 1)
    assert counts.accounted() == 3
    assert "2 dead letter(s) (1 internal errors)" in str(counts)
