"""Every codec on the GPU against the CPU codecs (marked ``gpu``, skipped without one).

For each codec spec (ZFP 1-D at rates from 3 to 32 bits per value and 2-D/3-D blocks; MPC with
budgets and dims; q8/q4 with their block sizes and stochastic rounding) and each dtype it takes
(float32, bfloat16, float16, float64): the GPU's payloads, ok flags and byte counts are the CPU's
byte for byte, and decoding them gives the CPU's values bit for bit. Random and hostile bytes
decode on the GPU without a crash to what the CPU decodes from them: ZFP and q8/q4 decode any bytes
(ZFP bit for bit); MPC reports the same status per row and the same values (zeros for a malformed
row). The CPU codecs themselves are tested against zfpy and numpy oracles (tests/test_zfp.py,
test_mpc.py, test_quant.py).

Float arithmetic on hostile values meets two differences of the platforms' float environments,
allowed where sums (decode-and-sum) or products (q8/q4 scales) of such values run into them:
XLA:CPU flushes subnormal inputs and results to zero and x86 keeps NaN payloads, while CUDA keeps
subnormals and returns canonical NaNs. There values agree once NaNs are matched as NaNs and
differences within the subnormal range (terms x the smallest normal) are allowed; anything else,
an overflow to inf included, must agree bit for bit.

``JAXHC_CROSS_PLATFORM=cpu`` compares the first CPU device with a second one instead (it checks
this file's code on a machine without a GPU; it cannot find a GPU bug).
"""

from __future__ import annotations

import functools
import os

import fuzz_mpc
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxhc.codecs import Mpc, Quant, Zfp, parse
from jaxhc.codecs._mpc import decode_flat
from tests._zfp_oracle import families, fma_telling_payloads

TARGET = os.environ.get("JAXHC_CROSS_PLATFORM", "gpu")


def _target_devices() -> list:
    try:
        devices = jax.devices(TARGET)
    except RuntimeError:
        return []
    return devices[1:] if TARGET == "cpu" else devices


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _target_devices(), reason=f"no {TARGET} device"),
]

DTYPES = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float64": np.float64,
}
NARROW = ("float32", "bfloat16", "float16")
ZFP_RATES = ("3", "5.5", "8", "12.25", "16", "24", "32")
# Every codec and option with float32; the other dtypes with the codecs and options whose kernels
# they change (bfloat16/float16 widen to float32 for ZFP and q8/q4; MPC codes 16-bit words).
CASES = [
    *((f"zfp:{r}", "float32") for r in ZFP_RATES),
    *((f"zfp:{r}", d) for r in ("8", "16") for d in ("bfloat16", "float16")),
    *((f"zfp:{r}", "float64") for r in ("8", "16", "40", "64")),
    *((s, "float32") for s in ("zfp:1:d3", "zfp:8:d2", "zfp:8:d3", "zfp:16:d3")),
    *((s, d) for s in ("zfp:8:d2", "zfp:8:d3") for d in ("bfloat16", "float16")),
    ("zfp:8:d3", "float64"),
    ("zfp:50:d2", "float64"),
    *(("mpc", d) for d in DTYPES),
    *((s, d) for s in ("mpc:0.5", "mpc:dim=3", "mpc:0.8:dim=64") for d in DTYPES if d != "float16"),
    *((s, d) for s in ("q8", "q4", "q8:sr") for d in NARROW),
    *((s, "float32") for s in ("q8:b128", "q4:b32", "q8:b8", "q4:b64:sr7")),
    ("q4:b64:sr7", "bfloat16"),
]
N = 4099  # partial last blocks, chunks and rows in every layout
PARTS = 3  # payloads summed by decode_sum


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):  # float64 cases; every other dtype is explicit
        yield


def devices():
    return jax.devices("cpu")[0], _target_devices()[0]


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_same(want, got, what: str) -> None:
    want, got = np.asarray(want), np.asarray(got)
    assert want.shape == got.shape and want.dtype == got.dtype, what
    bad = bits(want) != bits(got)
    assert not bad.any(), f"{what}: {int(bad.sum())} differ, first at {np.argwhere(bad)[:3]}"


def assert_same_up_to_float_env(want, got, terms: int, what: str) -> None:
    """Bits equal, except NaN where NaN and differences within terms x the smallest normal (see
    the module docstring)."""
    want, got = np.asarray(want), np.asarray(got)
    assert want.shape == got.shape and want.dtype == got.dtype, what
    wf, gf = want.astype(np.float64), got.astype(np.float64)
    tiny = float(np.finfo(np.float64 if want.dtype == np.float64 else np.float32).tiny) * terms
    with np.errstate(invalid="ignore"):
        close = np.isfinite(wf) & np.isfinite(gf) & (np.abs(wf - gf) <= tiny)
    ok = (bits(want) == bits(got)) | (np.isnan(wf) & np.isnan(gf)) | close
    bad = ~ok
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} differ, first at {np.argwhere(bad)[:3].tolist()}: "
        f"cpu {wf[bad][:3]} gpu {gf[bad][:3]}"
    )


def inputs(dtype, n: int = N) -> np.ndarray:
    """Rows of every value family of the ZFP tests (smooth, noisy, huge, subnormal, zeros ...)
    and one with NaN and +-inf sprinkled in."""
    wide = np.float64 if dtype == np.float64 else np.float32
    rows = list(families(wide, n).values())
    special = families(wide, n, seed=1)["walk"]
    special[::97], special[5::101], special[9::103] = np.nan, np.inf, -np.inf
    with np.errstate(over="ignore"):
        return np.stack([*rows, special]).astype(dtype)


def hostile(codec, n: int, dtype, rng) -> np.ndarray:
    """Payload rows of random and patterned bytes; for q8/q4 also scales that are inf, NaN,
    huge, subnormal or negative."""
    size = codec.payload_bytes(n, dtype)
    rows = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(4)]
    rows += [np.full(size, b, np.uint8) for b in (0x00, 0xFF, 0x80, 0x55, 0x7F)]
    if isinstance(codec, Quant):
        blocks = -(-n // codec.block)
        scales = np.resize(
            np.array([np.inf, np.nan, -np.inf, 3e38, 1e-40, -0.0, 1e-38, -5.0], np.float32), blocks
        )
        for r in rows[:2]:
            r[: 4 * blocks] = scales.view(np.uint8)
    return np.stack(rows)


@functools.cache
def program(spec: str, n: int, dtype_name: str):
    """One jitted function per case: encode rows, decode their payloads and hostile payloads,
    and (fixed-size codecs, whose decode_sum is a fused kernel) decode_sum of both."""
    codec, dtype = parse(spec), jnp.dtype(DTYPES[dtype_name])
    if isinstance(codec, Mpc):  # the status of every row, no raise on a malformed one
        decode = functools.partial(decode_flat, n=n, dtype=dtype, dim=codec.dim, strict=False)
    else:
        decode = functools.partial(codec.decode, shape=(n,), dtype=dtype)

    def run(x, bad):
        enc = jax.vmap(codec.encode)(x)
        out = {"payload": enc.payload, "ok": enc.ok, "nbytes": enc.nbytes}
        out["decoded"], out["hostile"] = jax.vmap(decode)(enc.payload), jax.vmap(decode)(bad)
        if not isinstance(codec, Mpc):
            out["sum"] = codec.decode_sum(enc.payload[:PARTS], n, dtype)
            out["hostile_sum"] = codec.decode_sum(bad[:PARTS], n, dtype)
        return out

    return codec, jax.jit(run)


def run_both(spec: str, x: np.ndarray, bad: np.ndarray, dtype_name: str):
    _, fn = program(spec, x.shape[-1], dtype_name)
    cpu, other = devices()
    on_cpu = jax.device_get(fn(jax.device_put(x, cpu), jax.device_put(bad, cpu)))
    on_other = jax.device_get(fn(jax.device_put(x, other), jax.device_put(bad, other)))
    return on_cpu, on_other


def compare(spec: str, want: dict, got: dict, where: str) -> None:
    for key in ("payload", "ok", "nbytes"):
        assert_same(want[key], got[key], f"{spec} {where} {key}")
    if isinstance(want["hostile"], tuple):  # MPC: values and status of each row
        for key in ("decoded", "hostile"):
            assert_same(want[key][1], got[key][1], f"{spec} {where} {key} status")
            assert_same(want[key][0], got[key][0], f"{spec} {where} {key} values")
        return
    assert_same(want["decoded"], got["decoded"], f"{spec} {where} decoded")
    if spec.startswith("zfp"):  # every bit of ZFP's decode is integer work
        assert_same(want["hostile"], got["hostile"], f"{spec} {where} hostile")
    else:
        assert_same_up_to_float_env(want["hostile"], got["hostile"], 1, f"{spec} {where} hostile")
    for key in ("sum", "hostile_sum"):
        if key in want:
            assert_same_up_to_float_env(want[key], got[key], PARTS, f"{spec} {where} {key}")


@pytest.mark.parametrize("spec,dtype", CASES, ids=[f"{s}-{d}" for s, d in CASES])
def test_payloads_and_decodes_are_the_cpus(spec, dtype):
    codec = parse(spec)
    rng = np.random.default_rng(len(spec) * 31 + len(dtype))
    x = inputs(DTYPES[dtype])
    bad = hostile(codec, N, DTYPES[dtype], rng)
    if isinstance(codec, Mpc):  # malformed copies of the CPU's own payloads (tests/fuzz_mpc.py)
        want, _ = run_both(spec, x, bad, dtype)
        payloads, used = np.asarray(want["payload"]), np.asarray(want["nbytes"])
        fits = np.flatnonzero(np.asarray(want["ok"]))  # a payload over budget is cut short
        picks = fits[np.arange(24) % len(fits)]
        mutated = [fuzz_mpc.mutate(payloads[i], int(used[i]), -(-N // 1024), rng) for i in picks]
        bad = np.concatenate([bad, np.stack(mutated)])
    want, got = run_both(spec, x, bad, dtype)
    compare(spec, want, got, f"n={N}")


LENGTH_CASES = [
    ("zfp:8", "float32"),
    ("zfp:16:d3", "bfloat16"),
    ("mpc", "float16"),
    ("q4:b8", "float32"),
]


@pytest.mark.parametrize("spec,dtype", LENGTH_CASES, ids=[f"{s}-{d}" for s, d in LENGTH_CASES])
def test_short_rows_are_the_cpus(spec, dtype):
    """Rows of 1 value up to a little over a block, chunk or group."""
    codec = parse(spec)
    rng = np.random.default_rng(5)
    for n in (1, 5, 65, 1025):
        x = inputs(DTYPES[dtype], n)
        want, got = run_both(spec, x, hostile(codec, n, DTYPES[dtype], rng), dtype)
        compare(spec, want, got, f"n={n}")


LONG_CASES = [
    ("zfp:8", "bfloat16"),
    ("zfp:8:d3", "float32"),
    ("q8", "float32"),
    ("q4:b64:sr7", "float16"),
    ("mpc", "float32"),
    ("mpc:dim=2", "bfloat16"),
]


@pytest.mark.parametrize("spec,dtype", LONG_CASES, ids=[f"{s}-{d}" for s, d in LONG_CASES])
def test_long_rows_are_the_cpus(spec, dtype):
    """Three million values: many thread blocks, and rows longer than a grid's first pass."""
    rng = np.random.default_rng(9)
    n = 3_000_001
    walk = np.cumsum(rng.standard_normal(n)) * rng.uniform(0.5, 2, n)
    x = np.stack([walk, rng.standard_normal(n)]).astype(DTYPES[dtype])
    codec = parse(spec)
    bad = hostile(codec, n, DTYPES[dtype], rng)[[0, 1, 2, 5]]
    want, got = run_both(spec, x, bad, dtype)
    compare(spec, want, got, f"n={n}")


def test_decode_sum_adds_rounded_values():
    """The fused zfp decode-and-sum rounds each decoded value before adding (no FMA), on the GPU
    as on the CPU: it equals decoding each payload, then adding, also where a product overflows
    (tests/_zfp_oracle.py: fma_telling_payloads)."""
    codec, n = Zfp(32), 1024
    payloads, want = fma_telling_payloads(n // 4)
    run = jax.jit(lambda p: codec.decode_sum(p, n, jnp.float32))
    for dev in devices():
        assert_same(want, run(jax.device_put(payloads, dev)), f"decode_sum on {dev.platform}")
