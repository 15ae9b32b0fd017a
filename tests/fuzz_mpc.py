"""Fuzz the MPC decoder with malformed payloads; every case must decode or fail cleanly.

Each batch mutates valid payloads (byte and bit flips, truncation by zeroing, random headers,
chunk-table corruption, garbage with a plausible header) and decodes the whole batch in one FFI
call with ``strict=False``, so every row reports its own status. A case passes when its status is
a known code, a rejected row came back all zeros, and an unchanged payload decoded exactly.
A crash or hang of the decoder takes the process down, which fails the run.

    python tests/fuzz_mpc.py --cases 1000000            # the long run
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxhc.codecs import Mpc
from jaxhc.codecs._mpc import decode_flat

WIDTH = {2: np.uint16, 4: np.uint32, 8: np.uint64}
STATUS_COUNT = 9  # mpc::kStatusCount in ffi/core/mpc.h
HEADER = 16

# (dtype, n, dim): small items so that a batch of thousands stays cheap; partial last chunks.
SHAPES = [
    (jnp.float32, 2500, 1),
    (jnp.bfloat16, 3000, 2),
    (jnp.float16, 1100, 3),
    (jnp.float32, 7, 1),
    (jnp.float64, 1500, 8),
]


def base_items(dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    """A few inputs whose payloads mix raw and compressed chunks, sparse and dense bitmaps."""
    t = np.linspace(0, 8, n)
    kinds = [
        np.sin(t) * 3,
        np.cumsum(rng.normal(size=n)),
        rng.normal(0, 0.02, n),
        np.where(rng.random(n) < 0.9, 0.0, rng.normal(size=n)),
        np.zeros(n),
    ]
    width = WIDTH[jnp.dtype(dtype).itemsize]
    noise = rng.integers(0, np.iinfo(width).max, n, dtype=width, endpoint=True).view(dtype)
    return np.stack([k.astype(dtype) for k in kinds] + [noise])


def mutate(p: np.ndarray, used: int, nchunks: int, rng: np.random.Generator) -> np.ndarray:
    """One malformed (or, by chance, still valid) copy of payload p."""
    q = p.copy()
    cap = q.size
    table_end = HEADER + 4 * nchunks
    kind = rng.integers(9)
    if kind == 0:  # a few random bytes, mostly inside the used part
        for _ in range(rng.integers(1, 9)):
            q[rng.integers(min(cap, used + 8))] ^= rng.integers(1, 256)
    elif kind == 1:  # one bit
        q[rng.integers(used)] ^= np.uint8(1 << rng.integers(8))
    elif kind == 2:  # truncation: everything from a point on zeroed
        q[rng.integers(used) :] = 0
    elif kind == 3:  # random header bytes
        for _ in range(rng.integers(1, 5)):
            q[rng.integers(HEADER)] = rng.integers(256)
    elif kind == 4:  # one table entry set to a random or a nearby value
        i = HEADER + 4 * rng.integers(nchunks)
        v = int(q[i : i + 4].view(np.uint32)[0])
        v = int(rng.integers(2**32)) if rng.random() < 0.3 else v + int(rng.integers(-16, 17))
        q[i : i + 4] = np.array([v % 2**32], np.uint32).view(np.uint8)
    elif kind == 5:  # the used field nudged
        v = int(q[12:16].view(np.uint32)[0]) + int(rng.integers(-64, 65))
        q[12:16] = np.array([v % 2**32], np.uint32).view(np.uint8)
    elif kind == 6:  # garbage after a valid header and table
        q[table_end:] = rng.integers(0, 256, cap - table_end, dtype=np.uint8)
    elif kind == 7:  # garbage everywhere
        q[:] = rng.integers(0, 256, cap, dtype=np.uint8)
    else:  # a stream's first bytes (top and bitmap words) rewritten
        c = rng.integers(nchunks)
        start = (HEADER + 4 * nchunks + 7) // 8 * 8
        if c:
            start += int(q[HEADER + 4 * (c - 1) : HEADER + 4 * c].view(np.uint32)[0])
        for _ in range(rng.integers(1, 4)):
            q[min(cap - 1, start + rng.integers(12))] ^= rng.integers(1, 256)
    return q


class Fuzzer:
    """Compiled encode/decode for one (dtype, n, dim) and a batch checker."""

    def __init__(self, dtype, n: int, dim: int, device=None):
        self.dtype, self.n, self.dim = jnp.dtype(dtype), n, dim
        self.codec = Mpc(dim=dim)
        self.device = device
        self.nchunks = -(-n // 1024)
        self._encode = jax.jit(jax.vmap(self.codec.encode))
        self._decode = jax.jit(jax.vmap(lambda p: decode_flat(p, n, self.dtype, dim, strict=False)))

    def bases(self, rng):
        x = base_items(self.dtype, self.n, rng)
        enc = self._encode(jax.device_put(x, self.device))
        return x, np.asarray(enc.payload), np.asarray(enc.nbytes)

    def run_batch(self, batch: int, rng) -> np.ndarray:
        """Decodes `batch` mutated payloads; returns their statuses. Raises AssertionError."""
        x, payloads, used = self.bases(rng)
        pick = rng.integers(len(x), size=batch)
        rows = np.stack([mutate(payloads[i], int(used[i]), self.nchunks, rng) for i in pick])
        rows[:2] = payloads[pick[:2]]  # controls
        out, status = self._decode(jax.device_put(rows, self.device))
        out, status = np.asarray(out), np.asarray(status)
        width = WIDTH[self.dtype.itemsize]
        bits, want = out.view(width), x.view(width)
        assert ((status >= 0) & (status < STATUS_COUNT)).all(), f"unknown status {set(status)}"
        bad = status != 0
        assert not bits[bad].any(), "a rejected row was not zeroed"
        same = (rows == payloads[pick]).all(axis=1)
        assert (status[same] == 0).all(), "an unchanged payload was rejected"
        assert (bits[same] == want[pick[same]]).all(), "an unchanged payload decoded wrong"
        return status


def run(cases: int, seed: int, batch: int, device=None, log=None) -> np.ndarray:
    """Runs `cases` fuzz cases over SHAPES; returns the count of each status."""
    with jax.enable_x64(True):  # float64 items
        return _run(cases, seed, batch, device, log)


def _run(cases, seed, batch, device, log):
    rng = np.random.default_rng(seed)
    fuzzers = [Fuzzer(*shape, device=device) for shape in SHAPES]
    counts = np.zeros(STATUS_COUNT, np.int64)
    done, i, t0 = 0, 0, time.perf_counter()
    while done < cases:
        b = min(batch, cases - done)
        status = fuzzers[i % len(fuzzers)].run_batch(b, rng)
        counts += np.bincount(status, minlength=STATUS_COUNT)
        done, i = done + b, i + 1
        if log and (i % 50 == 0 or done == cases):
            log(f"{done} cases, {time.perf_counter() - t0:.0f} s, status counts {counts.tolist()}")
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--platform", default=None, help="cpu or cuda (default: jax's default)")
    args = ap.parse_args(argv)
    device = jax.devices(args.platform)[0] if args.platform else None
    counts = run(args.cases, args.seed, args.batch, device, log=print)
    print(f"ok: {args.cases} cases, none crashed; status counts {counts.tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
