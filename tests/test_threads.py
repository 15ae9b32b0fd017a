"""Codec thread control: JAXHC_THREADS = 1, 2, 3, 5, 8 give the same payloads, bit-exact round
trips and (ZFP) zfpy's stream, on rows of several MiB; the MPC encoder's split of a large row
across threads (the shape that once raced: >= 3 runs) included. The variable is read once per
process, so every thread count runs in its own subprocess; more threads than cores is the point
(it is how a 2-core machine runs the >= 3-thread code paths). Eight handlers at once (one per
simulated device) share the pool."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zfpy
from _tiers import quick

THREADS = [1, 2, 3, 5, 8]
ZFP_N = 3_000_001  # 12 MB of float32, a partial last block
ZFP_RATE = 8

# Runs in a subprocess with JAXHC_THREADS set (argv: ZFP_N, ZFP_RATE); prints a JSON of digests
# and checks.
CHILD = r"""
import hashlib, json, sys
import jax, jax.numpy as jnp, numpy as np
from jaxhc import _native
from jaxhc.codecs import Mpc, Zfp

def walk(n, seed):
    return np.cumsum(np.random.default_rng(seed).normal(size=n)).astype(np.float32)

def digest(a):
    return hashlib.sha256(np.asarray(a).tobytes()).hexdigest()

out = {"threads": _native.cpu.threads()}
# One MPC row of 16 MiB (4096 chunks; 64 per thread run at least), encoded three times: every
# run of a thread must land where a one-thread encode puts it.
x = walk(1 << 22, 0)
codec = Mpc()
enc = jax.jit(codec.encode)
dec = jax.jit(lambda p: codec.decode(p, x.shape, x.dtype))
payloads = [enc(x) for _ in range(3)]
out["mpc"] = [digest(e.payload) for e in payloads]
out["mpc_exact"] = all(
    np.array_equal(np.asarray(dec(e.payload)).view(np.uint32), x.view(np.uint32)) for e in payloads
)
# A budget that cuts the row inside a later run.
cut = Mpc(budget=0.6 * int(payloads[0].nbytes) / x.nbytes)
e = jax.jit(cut.encode)(x)
out["mpc_cut"] = [bool(e.ok), digest(e.payload)]
# Rows of mixed compressibility (random bits, then a walk; and the reverse): runs of every stream
# size, coded in place or staged and copied to their start, whichever thread gets there first. A
# budget the row fits gives the same bytes.
noise = np.random.default_rng(5).integers(0, 2**32, 1 << 20, dtype=np.uint32).view(np.float32)
smooth = walk(1 << 21, 6)
out["mpc_mixed"], out["mpc_mixed_exact"] = [], True
for m in (np.concatenate([noise, smooth[: 1 << 20]]), np.concatenate([smooth, noise[: 1 << 19]])):
    e = jax.jit(codec.encode)(m)
    fit = jax.jit(Mpc(budget=(int(e.nbytes) / m.nbytes + 1) / 2).encode)(m)
    y = jax.jit(lambda p, m=m: codec.decode(p, m.shape, m.dtype))(e.payload)
    out["mpc_mixed"].append(digest(e.payload))
    out["mpc_mixed_exact"] &= bool(fit.ok) and np.array_equal(
        np.asarray(fit.payload), np.asarray(e.payload)[: fit.payload.shape[0]]
    ) and np.array_equal(np.asarray(y).view(np.uint32), m.view(np.uint32))
# Rows of a batch (bfloat16, dim 2): each row split across threads in turn.
rows = np.stack([walk(1 << 20, s) for s in (1, 2, 3)]).astype(jnp.bfloat16)
b = Mpc(dim=2)
eb = jax.jit(jax.vmap(b.encode))(rows)
yb = jax.jit(jax.vmap(lambda p: b.decode(p, (1 << 20,), jnp.bfloat16)))(eb.payload)
out["mpc_rows"] = digest(eb.payload)
out["mpc_rows_exact"] = bool(np.array_equal(np.asarray(yb).view(np.uint16), rows.view(np.uint16)))
# Eight handlers at once (one per host device), each splitting its 2 MiB row over the pool.
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
xs = np.stack([walk(1 << 19, 10 + i) for i in range(8)])
def per_device(v):
    enc = Mpc().encode(v[0])
    return enc.payload[None], Mpc().decode(enc.payload, v[0].shape, v.dtype)[None]
f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
pd, yd = f(jax.device_put(xs, NamedSharding(mesh, P("d"))))
out["mpc_devices"] = digest(pd)
out["mpc_devices_exact"] = bool(np.array_equal(np.asarray(yd).view(np.uint32), xs.view(np.uint32)))
# ZFP, rate 8, against zfpy in the parent.
z = walk(int(sys.argv[1]), 4)
zc = Zfp(rate=int(sys.argv[2]))
ez = jax.jit(zc.encode)(z)
out["zfp"] = digest(ez.payload)
out["zfp_decoded"] = digest(jax.jit(lambda p: zc.decode(p, z.shape, z.dtype))(ez.payload))
print(json.dumps(out))
"""


def run_child(threads) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAXHC_THREADS": str(threads)}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(ZFP_N), str(ZFP_RATE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def results():
    out = {}
    for t in THREADS:
        proc = run_child(t)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[t] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_thread_count_is_the_setting(results):
    assert [results[t]["threads"] for t in THREADS] == THREADS


def test_mpc_same_payloads_for_every_thread_count(results):
    one = results[1]
    for t in THREADS:
        r = results[t]
        assert r["mpc_exact"] and r["mpc_rows_exact"], f"JAXHC_THREADS={t}: not bit-exact"
        assert r["mpc"] == [one["mpc"][0]] * 3, f"JAXHC_THREADS={t}: payloads differ"
        assert r["mpc_cut"] == [False, one["mpc_cut"][1]], f"JAXHC_THREADS={t}: budget cut"
        assert r["mpc_mixed_exact"], f"JAXHC_THREADS={t}: mixed rows: not exact or staged apart"
        assert r["mpc_mixed"] == one["mpc_mixed"], f"JAXHC_THREADS={t}: mixed rows differ"
        assert r["mpc_rows"] == one["mpc_rows"], f"JAXHC_THREADS={t}: batch payloads differ"
        assert r["mpc_devices_exact"], f"JAXHC_THREADS={t}: 8 handlers at once: not bit-exact"
        assert r["mpc_devices"] == one["mpc_devices"], f"JAXHC_THREADS={t}: 8 handlers at once"


def test_zfp_matches_zfpy_for_every_thread_count(results):
    z = np.cumsum(np.random.default_rng(4).normal(size=ZFP_N)).astype(np.float32)
    stream = zfpy.compress_numpy(z, rate=ZFP_RATE, write_header=False)
    y = zfpy._decompress(stream, zfpy.dtype_to_ztype(z.dtype), [ZFP_N], rate=ZFP_RATE)
    want = hashlib.sha256(stream).hexdigest()
    want_y = hashlib.sha256(np.asarray(y).tobytes()).hexdigest()
    for t in THREADS:
        assert results[t]["zfp"] == want, f"JAXHC_THREADS={t}: stream differs from zfpy's"
        assert results[t]["zfp_decoded"] == want_y, f"JAXHC_THREADS={t}: decode differs"


@pytest.mark.parametrize("value", quick(["0", "-2", "two", "3x", "100000"], {"two"}))
def test_bad_setting_is_a_one_line_error(value):
    env = {**os.environ, "JAXHC_THREADS": value}
    proc = subprocess.run(
        [sys.executable, "-c", "import jaxhc.codecs"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert f"ValueError: JAXHC_THREADS={value} is not a whole number in 1..1024" in proc.stderr


@pytest.mark.slow  # CI time
def test_default_is_the_affinity_mask():
    env = {k: v for k, v in os.environ.items() if k != "JAXHC_THREADS"}
    code = "from jaxhc import _native; print(_native.cpu.threads())"
    cpus = sorted(os.sched_getaffinity(0))
    proc = subprocess.run(
        ["taskset", "-c", str(cpus[0]), sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == 1
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert int(proc.stdout) == len(cpus)
