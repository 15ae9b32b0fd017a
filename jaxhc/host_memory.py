"""Opt-in reuse of freed host memory, so that XLA:CPU's large buffers are not faulted in afresh.

XLA:CPU gives every call's results (and every program's temporaries) fresh buffers from malloc.
glibc serves a block of more than 128 KiB (32 MiB at most, as its threshold adapts) by a new
`mmap` and unmaps it when it is freed, so each call's large buffers are faulted in and zeroed
by the kernel page by page as the codec writes them: a one-thread ZFP rate 8 decode of 16M
float32 values into such a buffer takes 22 ms, 16 ms when the buffer's pages are reused
(bench/codecs.py, 2-core Zen 4 VM).

`reuse_freed_memory()` makes glibc serve blocks below 2 GiB from its heap (M_MMAP_THRESHOLD) and
keep freed heap memory instead of returning it to the OS (M_TRIM_THRESHOLD), so a later buffer
reuses pages already mapped. What it costs: the process keeps its peak heap (memory it frees is
reused, not given back), which for a training loop is its steady working set, and blocks of
different sizes freed and reused in turn can fragment it: five rounds of a 16M-value ZFP encode
and decode end at 460 MB resident (peak 524) with it, 273 MB (peak 401) without. glibc would give
threads other than the first heaps of their own (arenas of at most 64 MiB each), where a larger
block is still a fresh mapping: XLA:CPU's worker threads allocate most of a step's buffers, so
it also keeps every thread on the main heap (M_ARENA_MAX 1; call it before the threads start).
On the 2-host links run (P = 2, zhybrid, a loaded 2-core machine) the ranks' kernel time, page
faults mostly, went from 21 % of their CPU samples to 7 %. The setting is process-wide and cannot
be undone (glibc's adaptive threshold stays off); the `jaxhc train` command and the benchmarks
turn it on.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["freed_memory_reused", "reuse_freed_memory"]

# mallopt parameters (malloc.h) and the largest value mallopt takes (an int).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_LIMIT = 2**31 - 1

_reused = False


def _libc():
    """glibc's mallopt, or None where the C library is not glibc (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def reuse_freed_memory() -> bool:
    """Turn the reuse on (see the module docstring); True when it is on, False where the C
    library is not glibc (nothing changes there). Calling it again does nothing more.

    >>> from jaxhc import host_memory
    >>> host_memory.reuse_freed_memory() == host_memory.freed_memory_reused()
    True
    """
    global _reused
    if _reused:
        return True
    mallopt = _libc()
    if mallopt is None:
        return False
    if not (mallopt(_M_MMAP_THRESHOLD, _LIMIT) and mallopt(_M_TRIM_THRESHOLD, _LIMIT)):
        raise RuntimeError("glibc mallopt refused M_MMAP_THRESHOLD / M_TRIM_THRESHOLD = 2**31 - 1")
    if not mallopt(_M_ARENA_MAX, 1):
        raise RuntimeError("glibc mallopt refused M_ARENA_MAX = 1")
    _reused = True
    return True


def freed_memory_reused() -> bool:
    """Whether `reuse_freed_memory` has turned the reuse on in this process.

    >>> from jaxhc import host_memory
    >>> host_memory.freed_memory_reused() in (True, False)
    True
    """
    return _reused
