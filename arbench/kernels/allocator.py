"""Keep large CPU tensors in the malloc heap instead of fresh ``mmap`` pages.

glibc serves every allocation above 32 MiB (its largest mmap threshold) with a new ``mmap`` and
returns it to the kernel on free, so each training step page-faults (and the kernel zeroes)
every large activation again (what that cost once: results/kernels.md). ``keep_heap()`` turns
``mmap`` off for malloc and stops the heap from being trimmed, so freed blocks are reused by the
next step.
Peak resident memory is unchanged in kind (the high-water mark of live tensors), but memory is
not given back to the system until the process exits.

Set ``ARBENCH_MALLOC=system`` to keep glibc's defaults. A no-op off glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1
_TOP_PAD = 64 * 2**20  # grow the heap 64 MiB at a time (fewer brk calls)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


@functools.cache
def keep_heap() -> bool:
    """Configure glibc malloc as described above; True when it took effect (once per
    process)."""
    if os.environ.get("ARBENCH_MALLOC", "").lower() == "system":
        return False
    libc = _libc()
    return libc is not None and all(libc.mallopt(param, value) == 1 for param, value in (
        (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, _INT_MAX), (M_TOP_PAD, _TOP_PAD)))


__all__ = ["keep_heap"]
