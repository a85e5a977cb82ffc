"""A decoding worker keeps the blocks it frees for its next chunk instead of faulting them in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from cdcflow.connectors.spark import worker_process

# A chunk's life in a worker: the bytes read, a flag per byte, the line starts, a copy with one more line.
CHUNKS = """
import resource, sys
import numpy as np
from cdcflow.connectors.spark.worker_process import keep_freed_memory

kept = sys.argv[1] == "kept" and keep_freed_memory()
def chunks():
    for i in range(16):
        data = bytes(4 << 20) + b"\\n" * (i + 1)
        starts = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        longer = data + b"x"
        del data, starts, longer
chunks()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
chunks()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    """In a fresh process (glibc's settings are the process's): whether it kept, and its page faults."""
    out = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "-c", CHUNKS, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


GLIBC = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's allocator"
)


@GLIBC
def test_a_worker_that_keeps_its_freed_blocks_reads_chunks_without_faulting_their_pages_again() -> None:
    kept, kept_faults = _faults("kept")
    plain, plain_faults = _faults("plain")
    assert (kept, plain) == ("True", "False")
    assert plain_faults > 500  # the heap trimmed and grown again: a fault per page (64 KiB pages: ~3,600)
    assert kept_faults < plain_faults / 20


@GLIBC
def test_glibcs_own_settings_in_the_environment_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("MALLOC_MMAP_THRESHOLD_", str(1 << 20)),
        ("MALLOC_TRIM_THRESHOLD_", str(1 << 20)),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"),
    ):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            assert not worker_process.keep_freed_memory()
