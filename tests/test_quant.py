"""The q8/q4 block quantizers against a numpy oracle (tests/_quant_oracle.py): payload bytes and
decoded bits equal, the error bound, NaN/Inf, the fused decode-and-sum, specs, thread counts (the
rotated q4:h too; its own tests: tests/test_quant_rotated.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _quant_oracle import decode as oracle_decode
from _quant_oracle import encode as oracle_encode
from _quant_oracle import rotated_decode, rotated_encode
from _tiers import quick
from test_zfp import _has_gpu

from jaxhc import _native
from jaxhc.codecs import Codec, Quant, parse
from jaxhc.policy import Policy

KERNELS = _native.cpu.quant_kernels()
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
SIZES = [1, 7, 9, 255, 257, 4099]


@pytest.fixture(params=KERNELS)
def kernel(request, monkeypatch):
    """Each kernel this CPU runs (JAXHC_QUANT_KERNEL is read at every call)."""
    monkeypatch.setenv("JAXHC_QUANT_KERNEL", request.param)
    return request.param


def sample(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-3, 3, n))  # magnitudes over ~2.5 decades
    return x.astype(DTYPES[dtype])


def ours(codec: Quant, x: np.ndarray):
    enc = codec.encode(jnp.asarray(x))
    y = codec.decode(enc.payload, x.shape, x.dtype)
    return np.asarray(enc.payload).tobytes(), bool(enc.ok), np.asarray(y)


def assert_same_bits(got: np.ndarray, want: np.ndarray):
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bits", [8, 4])
def test_payload_and_values_equal_the_oracle(kernel, bits, dtype):
    for block in (8, 256):
        codec = Quant(bits=bits, block=block)
        for n in SIZES:
            x = sample(n, dtype, seed=n)
            payload, ok, y = ours(codec, x)
            want, want_ok = oracle_encode(x, bits, block)
            assert len(payload) == codec.payload_bytes(n, x.dtype) == len(want)
            assert payload == want, f"{codec.spec} {dtype} n={n}: payload differs"
            assert ok and want_ok
            assert_same_bits(y, oracle_decode(want, n, bits, block, x.dtype))


@pytest.mark.parametrize("bits", [8, 4])
def test_special_values_equal_the_oracle(kernel, bits):
    """Ties, zeros, -0.0, subnormals, blocks below 2^-100 and near the float32 maximum: the same
    bytes whatever flush-to-zero mode the handler runs in."""
    q = float((1 << (bits - 1)) - 1)
    blocks = [
        np.r_[q, np.arange(-q, q, 0.5)][:32],  # absmax q: inv = 1, every half a tie
        np.zeros(32),
        np.r_[-0.0, np.full(31, 0.0)],
        np.r_[1e-38, 5e-39, -1e-45, np.full(29, 3e-40)],  # subnormals: a zero block
        np.r_[2.0**-99, 2.0**-120, -(2.0**-101), np.full(29, 1e-41)],  # subnormals among normals
        np.r_[3e-31, np.linspace(-1e-31, 1e-31, 31)],  # 2^-100 < absmax: coded
        np.r_[3.4e38, -3.3e38, 1.0, np.linspace(-1e38, 1e38, 29)],
    ]
    x = np.concatenate([np.pad(b[:32], (0, 32 - b[:32].size)) for b in blocks]).astype(np.float32)
    codec = Quant(bits=bits, block=32)
    payload, ok, y = ours(codec, x)
    want, _ = oracle_encode(x, bits, 32)
    assert ok and payload == want
    assert_same_bits(y, oracle_decode(want, x.size, bits, 32))
    assert np.all(y[:32] == np.rint(x[:32]))  # half to even
    assert np.all(y[96:128] == 0)


@pytest.mark.parametrize("scale", [3e-7, 1e-5, 1e-3])
def test_float16_subnormals_equal_the_oracle(kernel, scale):
    """float16 rows whose values (and decoded values) are float16 subnormals, in and out of the
    vector code, and their fused sums, under XLA:CPU's flush-to-zero mode."""
    x = (np.random.default_rng(1).standard_normal(4099) * scale).astype(np.float16)
    for bits in (8, 4):
        codec = Quant(bits, 64)
        payload, _, y = ours(codec, x)
        want, _ = oracle_encode(x, bits, 64)
        assert payload == want
        assert_same_bits(y, oracle_decode(want, x.size, bits, 64, np.float16))
        rows = jnp.stack([codec.encode(jnp.asarray(v)).payload for v in (x, x[::-1].copy())])
        fused = jax.jit(lambda r, c=codec: c.decode_sum(r, x.size, jnp.float16))(rows)
        unfused = jax.jit(lambda r, c=codec: Codec.decode_sum(c, r, x.size, jnp.float16))(rows)
        assert_same_bits(np.asarray(fused), np.asarray(unfused))
    assert np.mean(np.abs(y.astype(np.float32)) < 2.0**-14) > (0.9 if scale < 1e-4 else 0.01)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", [64, 256])
def test_error_within_half_a_step(bits, block):
    """|x - decoded| <= s / 2 (s = absmax / Q) plus float32 rounding of a few ulps of absmax."""
    x = sample(50_000, "float32", seed=1)
    x[::977] *= 100.0  # outliers: they set their blocks' scales
    _, ok, y = ours(Quant(bits=bits, block=block), x)
    assert ok
    pad = -x.size % block
    amax = np.abs(np.r_[x, np.zeros(pad, np.float32)]).reshape(-1, block).max(axis=1)
    step = np.repeat(amax / ((1 << (bits - 1)) - 1), block)[: x.size]
    err = np.abs(x.astype(np.float64) - y)
    bound = step / 2 + np.repeat(amax, block)[: x.size] * 2.0**-22
    assert np.all(err <= bound)
    assert np.max(err / step) > 0.4  # errors reach close to half a step: the bound is tight
    assert np.linalg.norm(x - y) / np.linalg.norm(x) < {8: 0.02, 4: 0.3}[bits]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_non_finite_is_not_ok_and_codes_a_zero_block(bad, dtype):
    x = sample(1000, dtype, seed=2)
    x[300] = bad
    codec = Quant(bits=8)
    payload, ok, y = ours(codec, x)
    want, want_ok = oracle_encode(x, 8, 256)
    assert not ok and not want_ok and payload == want
    assert np.all(np.asarray(y[256:512], np.float32) == 0)  # the block that held it
    rows = jnp.stack([jnp.asarray(sample(1000, dtype, seed=3)), jnp.asarray(x)])
    assert np.asarray(jax.vmap(codec.encode)(rows).ok).tolist() == [True, False]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("spec", ["q8", "q4:b64"])
def test_batched_rows_under_vmap_equal_the_oracle(spec, dtype):
    codec = parse(spec)
    rows = np.stack([sample(777, dtype, seed=s) for s in range(5)])
    enc = jax.jit(jax.vmap(codec.encode))(jnp.asarray(rows))
    dec = jax.jit(jax.vmap(lambda p: codec.decode(p, (777,), rows.dtype)))(enc.payload)
    for r in range(5):
        want, _ = oracle_encode(rows[r], codec.bits, codec.block)
        assert np.asarray(enc.payload[r]).tobytes() == want
        assert_same_bits(
            np.asarray(dec[r]), oracle_decode(want, 777, codec.bits, codec.block, rows.dtype)
        )


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("parts", quick([1, 3, 8], {3}))  # every count under `slow` (CI time)
@pytest.mark.parametrize("spec", ["q8", "q4:b32"])
def test_fused_decode_sum_is_decode_then_sum(kernel, spec, parts, dtype):
    """Bit for bit Codec.decode_sum under jit (XLA:CPU's flush-to-zero included: the tiny rows
    make subnormal partial sums)."""
    codec = parse(spec)
    n = 1003
    rows = [sample(n, dtype, seed=10 + p) for p in range(parts)]
    rows += [(sample(n, "float32", seed=20 + p) * 2.0**-99).astype(DTYPES[dtype]) for p in range(2)]
    payloads = jax.jit(jax.vmap(codec.encode))(jnp.asarray(np.stack(rows))).payload
    fused = jax.jit(lambda p: codec.decode_sum(p, n, DTYPES[dtype]))
    unfused = jax.jit(lambda p: Codec.decode_sum(codec, p, n, DTYPES[dtype]))
    for sel in (slice(0, parts), slice(parts, parts + 2), slice(0, parts + 2)):
        assert_same_bits(np.asarray(fused(payloads[sel])), np.asarray(unfused(payloads[sel])))


def oracle(x: np.ndarray, codec: Quant):
    """(payload, ok, decoded values) of the numpy oracle for a q8/q4 codec, rotated or not."""
    if not codec.rotate:
        payload, ok = oracle_encode(x, codec.bits, codec.block, codec.stochastic, codec.seed)
        return payload, ok, oracle_decode(payload, x.size, codec.bits, codec.block, x.dtype)
    levels, thresholds = _native.cpu.quant_levels(codec.bits)
    payload, ok = rotated_encode(x, codec.bits, codec.block, thresholds)
    return payload, ok, rotated_decode(payload, x.size, codec.bits, codec.block, levels, x.dtype)


GPU_SPECS = ["q8", "q4:b64", "q4:b8", "q4:h", "q8:h", "q4:b64:h", "q8:b1024:h"]


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no GPU")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("spec", GPU_SPECS)
def test_gpu_equals_the_oracle(spec, dtype):
    """The CUDA kernels (core/quant.h, quant_rotated.h): payloads, values and rank-order sums as
    the oracle's."""
    codec, gpu, dt = parse(spec), jax.devices("gpu")[0], DTYPES[dtype]
    for n in SIZES:
        rows = np.stack([sample(n, dtype, seed=n + s) for s in range(3)])
        rows[2, n // 2] = np.inf
        enc = jax.jit(jax.vmap(codec.encode))(jax.device_put(rows, gpu))
        dec = jax.jit(jax.vmap(lambda p, n=n: codec.decode(p, (n,), dt)))(enc.payload)
        total = jax.jit(lambda p, n=n: codec.decode_sum(p, n, dt))(enc.payload[:2])
        want = [oracle(r, codec) for r in rows]
        assert np.asarray(enc.ok).tolist() == [w[1] for w in want]
        decoded = [w[2] for w in want]
        for r in range(3):
            assert np.asarray(enc.payload[r]).tobytes() == want[r][0], f"n={n} row {r}"
            assert_same_bits(np.asarray(dec[r]), decoded[r])
        summed = (decoded[0].astype(np.float32) + decoded[1].astype(np.float32)).astype(rows.dtype)
        assert_same_bits(np.asarray(total), summed)


# --- stochastic rounding ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_rounding_equals_the_oracle(kernel, bits, dtype):
    for block, seed in ((8, 0), (256, 12345), (256, 2**32 - 1)):
        codec = Quant(bits=bits, block=block, stochastic=True, seed=seed)
        for n in SIZES:
            x = sample(n, dtype, seed=n)
            payload, ok, y = ours(codec, x)
            want, want_ok = oracle_encode(x, bits, block, stochastic=True, seed=seed)
            assert payload == want, f"n={n} block={block} seed={seed}"
            assert ok == want_ok
            assert_same_bits(y, oracle_decode(want, n, bits, block, x.dtype))


@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_rounding_is_unbiased_over_seeds(bits):
    """Values at fractions 0.1, 1/3 and 0.8 of a step above a code (scale 1: each block's
    absmax is Q). Round to nearest errs by -0.1, -1/3 and +0.2 steps on every one of them; the
    stochastic decoded values' mean error over 64 seeds is within 0.02 steps of 0 for each
    fraction (its standard error there is below 0.004), and every value is within one step."""
    q = (1 << (bits - 1)) - 1
    rng = np.random.default_rng(bits)
    fracs = np.array([0.1, 1 / 3, 0.8])
    group = np.repeat(np.arange(3), 1024)
    x = (rng.integers(-q, q - 1, group.size) + fracs[group]).astype(np.float32)
    x[::256] = q  # the absmax of every block
    mark = np.ones(x.size, bool)
    mark[::256] = False

    def errors(codec):
        return (ours(codec, x)[2].astype(np.float64) - x)[mark]

    nearest = errors(Quant(bits))
    for f, e in zip(fracs, [nearest[group[mark] == g] for g in range(3)], strict=True):
        np.testing.assert_allclose(e, -f if f < 0.5 else 1 - f, atol=1e-5)
    runs = np.stack([errors(Quant(bits, stochastic=True, seed=s)) for s in range(64)])
    assert np.abs(runs).max() < 1
    for g in range(3):
        assert abs(runs[:, group[mark] == g].mean()) < 0.02, f"fraction {fracs[g]:.3f}"
    assert not np.array_equal(runs[0], runs[1])  # the seed matters


@pytest.mark.parametrize(
    "spec, codec",
    [
        ("q8", Quant(8)),
        ("q4", Quant(4)),
        (" Q8:B128 ", Quant(8, 128)),
        ("q4:b8", Quant(4, 8)),
        ("q8:sr", Quant(8, stochastic=True)),
        ("q4:b128:sr7", Quant(4, 128, stochastic=True, seed=7)),
        ("q4:h", Quant(4, rotate=True)),
        (" Q8:B64:H ", Quant(8, 64, rotate=True)),
        ("q4:b1024:h", Quant(4, 1024, rotate=True)),
    ],
)
def test_spec_round_trips(spec, codec):
    assert parse(spec) == codec and parse(codec.spec) == codec
    assert codec.bits_per_value == codec.bits + 32 / codec.block


@pytest.mark.parametrize(
    "spec, culprit",
    [
        ("q8:b100", "block 100"),
        ("q8:b0", "block 0"),
        ("q4:bx", "'q4:bx'"),
        ("q8:128", "'q8:128'"),
        ("q8:b64:b64", "'q8:b64:b64'"),
        ("q8:sr:b64", "'q8:sr:b64'"),
        ("q8:srx", "'q8:srx'"),
        ("q8:sr-1", "seed -1"),
        ("q16", "'q16'"),
        ("q4:b100:h", "block 100"),
        ("q4:b32:h", "block 32"),
        ("q4:b2048:h", "block 2048"),
        ("q4:h:h", "'q4:h:h'"),
        ("q4:h:b64", "'q4:h:b64'"),
        ("q4:sr:h", "'q4:sr:h'"),
        ("q4:hx", "'q4:hx'"),
    ],
)
def test_bad_spec_is_one_line_error_naming_it(spec, culprit):
    with pytest.raises(ValueError) as err:
        parse(spec)
    assert culprit in str(err.value) and "\n" not in str(err.value)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="bits 5 must be 8 or 4"):
        Quant(bits=5)
    with pytest.raises(ValueError, match="seed -1 must be an integer"):
        Quant(stochastic=True, seed=-1)
    with pytest.raises(ValueError, match="stochastic 1 must be true or false"):
        Quant(stochastic=1)
    with pytest.raises(ValueError, match="cannot encode dtype int32"):
        Quant().encode(jnp.zeros(8, jnp.float32).astype(jnp.int32))
    with pytest.raises(ValueError, match=r"payload must be uint8\[264\]"):
        Quant().decode(jnp.zeros(8, jnp.uint8), (256,), jnp.float32)
    with pytest.raises(ValueError, match=r"payloads must be uint8\[P, 264\]"):
        Quant().decode_sum(jnp.zeros((2, 8), jnp.uint8), 256, jnp.float32)
    assert not Quant().supports(jnp.float64) and not Quant().supports(jnp.int32)


def test_bad_kernel_setting_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("JAXHC_QUANT_KERNEL", "sse9")
    with pytest.raises(Exception, match="JAXHC_QUANT_KERNEL=sse9 is not one of auto, avx512, avx2"):
        jax.block_until_ready(Quant().encode(jnp.ones(16, jnp.float32)))


def test_policy_takes_quant_entries():
    p = Policy.from_dict(
        {"axes": {"data": {"codec": "q8", "block": 128}, "tensor": "q4", "pipe": "zfp:8"}}
    )
    assert p.codec_for("data") == Quant(8, 128) and p.codec_for("tensor") == Quant(4)
    assert p.codec_for(("data", "pipe")) == Quant(8, 128)  # more bits per value wins
    assert p.codec_for(("tensor", "pipe")) == parse("zfp:8")
    assert Policy.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="axes.data.codec: quant block 12 must be"):
        Policy.from_dict({"axes": {"data": {"codec": "q8", "block": 12}}})
    p = Policy.from_dict({"axes": {"data": {"codec": "q8", "stochastic": True, "seed": 3}}})
    assert p.codec_for("data") == Quant(8, stochastic=True, seed=3)
    assert p.to_dict()["axes"]["data"] == {"codec": "q8:sr3"}


def test_the_fused_mpi_engine_takes_quant_but_stochastic_rounding():
    from jaxhc.transport import _mpi_fused

    if _mpi_fused.available():
        assert _mpi_fused.supports(Quant(8), jnp.float32)
        assert _mpi_fused.supports(Quant(4, rotate=True), jnp.bfloat16)
    assert not _mpi_fused.supports(Quant(8, stochastic=True), jnp.float32)
    assert not _mpi_fused.supports(Quant(8), jnp.float16)


# Runs with JAXHC_THREADS set: digests of a multi-range encode, decode and decode-and-sum.
CHILD = r"""
import hashlib, json
import jax, jax.numpy as jnp, numpy as np
from jaxhc import _native
from jaxhc.codecs import Quant
digest = lambda a: hashlib.sha256(np.asarray(a).tobytes()).hexdigest()
x = np.random.default_rng(7).standard_normal((3, 1 << 19)).astype(np.float32)
out = {"threads": _native.cpu.threads()}
for codec in (Quant(8), Quant(4, 64), Quant(4, rotate=True)):
    enc = jax.jit(jax.vmap(codec.encode))(x)
    dec = jax.jit(lambda p: codec.decode(p, (x.shape[1],), jnp.float32))(enc.payload[0])
    total = jax.jit(lambda p: codec.decode_sum(p, x.shape[1], jnp.float32))(enc.payload)
    out[codec.spec] = [digest(enc.payload[0]), digest(dec), digest(total)]
print(json.dumps(out))
"""


def test_thread_counts_give_the_oracle_bytes():
    x = np.random.default_rng(7).standard_normal((3, 1 << 19)).astype(np.float32)
    want = {}
    for bits, block, spec in ((8, 256, "q8"), (4, 64, "q4:b64")):
        p, _ = oracle_encode(x[0], bits, block)
        rt = [oracle_decode(oracle_encode(r, bits, block)[0], r.size, bits, block) for r in x]
        total = rt[0] + rt[1] + rt[2]
        want[spec] = [hashlib.sha256(a).hexdigest() for a in (p, rt[0].tobytes(), total.tobytes())]
    levels, thresholds = _native.cpu.quant_levels(4)
    p = rotated_encode(x[0], 4, 256, thresholds)[0]
    rt = [
        rotated_decode(rotated_encode(r, 4, 256, thresholds)[0], r.size, 4, 256, levels) for r in x
    ]
    total = rt[0] + rt[1] + rt[2]
    want["q4:h"] = [hashlib.sha256(a).hexdigest() for a in (p, rt[0].tobytes(), total.tobytes())]
    for threads in (1, 3, 8):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD],
            env={**os.environ, "JAXHC_THREADS": str(threads)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got.pop("threads") == threads
        assert got == want, f"JAXHC_THREADS={threads}"
