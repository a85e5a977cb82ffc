"""What a Python worker that decodes sets up once, at its first task: settings of the process, not of a
task, that the decode's pace depends on.

- A reused worker runs a full ``gc.collect()`` after every task (pyspark's daemon.py), over every
  object the process has imported (pyspark, pyarrow, the decoders): ~0.1 s of CPU a task. What is
  alive once the decoders are imported is moved out of the collector's reach (after a collection, so
  no garbage is kept); objects freed by reference counts are freed as before.
- glibc's allocator trims its heap whenever twice its current mmap threshold is free at the top
  (~8 MiB once a 4 MiB block was freed; before that, blocks over 128 KiB are mapped afresh), so the
  4 MiB chunks a task reads and the numpy arrays and bytes made from them (Arrow's own buffers come
  from its pool) keep faulting their pages in again: ~5,000 page faults and ~0.03 CPU-s of kernel
  time per 32 MiB of JSON. Blocks of up to 16 MiB are kept in the heap, which is trimmed only when
  more than 32 MiB are free at its top, unless the worker's environment sets glibc's thresholds
  itself (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or their ``GLIBC_TUNABLES``). A worker
  then holds up to its peak heap (as glibc does for freed blocks below a live one) plus those 32 MiB.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
"""glibc's ``mallopt`` parameters (malloc.h)."""
MMAP_THRESHOLD_BYTES = 16 << 20
TRIM_THRESHOLD_BYTES = 32 << 20


@functools.cache
def prepare_worker() -> None:
    """Once per process: the collector spared the imports, the allocator keeping its blocks."""
    if os.environ.get("SPARK_REUSE_WORKER"):
        gc.collect()
        gc.freeze()
    keep_freed_memory()


def keep_freed_memory() -> bool:
    """Whether glibc's allocator was told to keep blocks of up to :data:`MMAP_THRESHOLD_BYTES` in its
    heap and up to :data:`TRIM_THRESHOLD_BYTES` of free heap mapped (see the module)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if (
        not sys.platform.startswith("linux")
        or any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))
        or "malloc.mmap_threshold" in tunables
        or "malloc.trim_threshold" in tunables
    ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
