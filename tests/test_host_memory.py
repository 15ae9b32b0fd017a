"""jaxhc.host_memory: after reuse_freed_memory(), glibc serves a 64 MiB block that a thread other
than the first allocates from its main heap (no fresh mapping) and keeps it when freed; without
it, the block is a fresh mapping. Each case runs in a child process (the setting is process-wide
and cannot be undone)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from jaxhc import host_memory

CHILD = r"""
import ctypes, json, sys
from jaxhc import host_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
import threading
on = host_memory.reuse_freed_memory() if sys.argv[1] == "on" else False
got = {}
def alloc():  # on another thread, as XLA:CPU's workers allocate
    got["p"] = libc.malloc(64 << 20)
t = threading.Thread(target=alloc)
t.start()
t.join()
p = got["p"]
mapped = libc.mallinfo2().hblkhd  # bytes in blocks that have their own mapping
libc.free(p)
print(json.dumps({"on": on, "reported": host_memory.freed_memory_reused(), "mapped": mapped,
                  "kept": libc.mallinfo2().arena}))
"""


def child(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


glibc = pytest.mark.skipif(
    host_memory._libc() is None or not hasattr(ctypes.CDLL(None), "mallinfo2"),
    reason="the C library is not glibc 2.33 or later (mallinfo2)",
)


@glibc
def test_a_large_block_comes_from_the_heap_and_stays():
    r = child("on")
    assert r["on"] and r["reported"]
    assert r["mapped"] < 64 << 20  # not a fresh mapping
    assert r["kept"] >= 64 << 20  # freed, yet still the heap's


@glibc
def test_by_default_a_large_block_is_a_fresh_mapping():
    r = child("off")
    assert not r["on"] and not r["reported"]
    assert r["mapped"] >= 64 << 20
