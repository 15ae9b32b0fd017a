"""MPC codec: bit-exact round trips of numpy-made bit patterns, payload sizes, budgets, jit / vmap /
shard_map, decoder errors and a decoder fuzz. The tests that take a `device` run on the CPU and,
marked ``gpu`` (skipped without one), on the GPU: there the same assertions hold, the payloads
must be the CPU's byte for byte, and a malformed payload is an error too (raised by the host
check of the decoder's status instead of by the decoder itself). On a GPU machine, also under
compute-sanitizer:

    XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool memcheck \
        python -m pytest -q -m gpu tests/test_mpc.py -k "not fuzz_decoder_long"
"""

import functools

import fuzz_mpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tiers import quick
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxhc import _native
from jaxhc.codecs import Mpc
from jaxhc.codecs._mpc import checked_on_host, decode_flat, status_message

WIDTH = fuzz_mpc.WIDTH
# (sign, exponent, mantissa) bits
LAYOUT = {
    "float16": (1, 5, 10),
    "bfloat16": (1, 8, 7),
    "float32": (1, 8, 23),
    "float64": (1, 11, 52),
}
SIZES = [1, 2, 15, 17, 31, 33, 63, 65, 1023, 1024, 1025, 2049, 3000]
# What a failed decode raises: the CPU decoder's FFI error; from the host check of a GPU decode's
# status, jax's error for a failed callback (a ValueError when the call ran synchronously).
DECODE_ERRORS = (jax.errors.JaxRuntimeError, ValueError)
# mpc::Status
OK, BAD_MAGIC, BAD_WORD, BAD_DIM, BAD_COUNT, BAD_USED, BAD_TABLE, BAD_STREAM, BAD_PAD = range(9)


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


PLATFORMS = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "gpu",
        id="gpu",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not _has_gpu(), reason="no GPU")],
    ),
]


@pytest.fixture(params=PLATFORMS)
def device(request):
    return jax.devices(request.param)[0]


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):  # float64 items; other dtypes are explicit
        yield


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(WIDTH[a.dtype.itemsize])


def patterns(dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of adversarial bit patterns of `dtype` (numpy made, the test oracle)."""
    dtype = np.dtype(jnp.dtype(dtype))
    _, e, m = LAYOUT[dtype.name]
    w = WIDTH[dtype.itemsize]
    one = w(1)

    def field(sign, exp, man):
        return ((sign.astype(w) << w(e + m)) | (exp.astype(w) << w(m)) | man.astype(w)).view(dtype)

    sign = rng.integers(0, 2, n)
    man = rng.integers(1, 2**m, n, dtype=np.uint64)  # nonzero
    top = 2**e - 1
    rows = {
        "nan": field(sign, np.full(n, top), man),  # quiet and signalling, all payloads
        "zeros": field(sign, np.zeros(n), np.zeros(n)),
        "denormal": field(sign, np.zeros(n), man),
        "inf": field(sign, np.full(n, top), np.zeros(n)),
        "random": rng.integers(0, np.iinfo(w).max, n, dtype=w, endpoint=True).view(dtype),
        "constant": np.full(n, rng.integers(0, np.iinfo(w).max, dtype=w, endpoint=True), w).view(
            dtype
        ),
        "ramp": (np.arange(n) * 0.37 - 5).astype(dtype),
        "walk": np.cumsum(rng.normal(size=n)).astype(dtype),
        "extremes": np.array([0, ~w(0), one, one << w(e + m), ~(one << w(e + m))], w)[
            rng.integers(0, 5, n)
        ].view(dtype),
    }
    mixed = np.stack(list(rows.values()))[rng.integers(0, len(rows), n), np.arange(n)]
    return np.stack([*rows.values(), mixed])


@functools.cache
def roundtrip_fn(dim: int):
    """jit(vmap(decode . encode)) over a batch of rows, for any row size and dtype."""
    codec = Mpc(dim=dim)

    def one(x):
        enc = codec.encode(x)
        return codec.decode(enc.payload, x.shape, x.dtype), enc

    return jax.jit(jax.vmap(one))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("dim", quick([1, 2, 3, 8], {1, 8}))  # all under `slow` (CI time)
def test_roundtrip_bit_exact(device, dtype, dim):
    rng = np.random.default_rng(dim)
    wb = jnp.dtype(dtype).itemsize
    for n in SIZES:
        x = patterns(dtype, n, rng)
        y, enc = roundtrip_fn(dim)(jax.device_put(x, device))
        np.testing.assert_array_equal(bits(y), bits(x), err_msg=f"n={n}")
        assert bool(enc.ok.all())
        assert (np.asarray(enc.nbytes) <= _native.cpu.mpc_max_payload_bytes(n, wb)).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_portable_cpu_path_writes_the_same_payloads(dtype, monkeypatch):
    # The CPU codec has a portable build and an x86-64-v3 one (AVX2 data movements and bit
    # transposes for 32- and 16-bit words, full chunks only): both must write and read the same
    # bytes.
    rng = np.random.default_rng(9)
    n = 5000  # four full chunks and a partial one
    x = np.concatenate(
        [patterns(dtype, n, rng), np.cumsum(rng.normal(size=(3, n)), 1).astype(dtype)]
    )
    for dim in (1, 3, 64):
        codec = Mpc(dim=dim)
        enc = jax.jit(jax.vmap(codec.encode))
        dec = jax.jit(jax.vmap(lambda p, c=codec: decode_flat(p, n, x.dtype, c.dim, strict=False)))
        fast = enc(x)
        monkeypatch.setenv("JAXHC_MPC_PORTABLE", "1")
        portable = enc(x)
        y, status = dec(fast.payload)
        monkeypatch.delenv("JAXHC_MPC_PORTABLE")
        np.testing.assert_array_equal(np.asarray(portable.payload), np.asarray(fast.payload))
        assert not np.asarray(status).any()
        np.testing.assert_array_equal(bits(y), bits(x))


def test_sizes_are_exact_formulas():
    for n in [1, 1023, 1024, 1025, 10**6]:
        for wb in (2, 4, 8):
            head = -(-(16 + 4 * -(-n // 1024)) // 8) * 8
            assert _native.cpu.mpc_header_bytes(n, wb) == head
            assert _native.cpu.mpc_max_payload_bytes(n, wb) == -(-(head + n * wb) // 8) * 8
            assert _native.cpu.mpc_scratch_bytes(n, wb) == -(-(n * wb) // 8) * 8


def test_payload_layout_and_ratio(device):
    rng = np.random.default_rng(0)
    n = 5000
    noise = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)
    smooth = np.sin(np.linspace(0, 3, n)).astype(np.float32)
    _, enc = roundtrip_fn(1)(
        jax.device_put(np.stack([noise, smooth, np.zeros(n, np.float32)]), device)
    )
    p, used = np.asarray(enc.payload), np.asarray(enc.nbytes)
    head = _native.cpu.mpc_header_bytes(n, 4)
    assert used[0] == head + 4 * n  # incompressible: every chunk raw, nothing more
    assert used[1] < head + 2 * n  # > 2x
    assert used[2] == head + 4 * 5  # zeros: a top word per chunk
    for row, u in zip(p, used, strict=True):
        assert bytes(row[:4]) == b"MPC\x01" and row[4] == 4 and row[5] == 1
        assert row[8:12].view(np.uint32)[0] == n and row[12:16].view(np.uint32)[0] == u
        assert not row[u:].any()  # XLA's buffer is uninitialized: the tail must be zeroed


def test_budget(device):
    rng = np.random.default_rng(1)
    n = 4096
    noise = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)
    smooth = np.sin(np.linspace(0, 3, n)).astype(np.float32)
    x = jax.device_put(np.stack([noise, smooth, noise]), device)
    codec = Mpc(budget=0.5)
    enc = jax.jit(jax.vmap(codec.encode))(x)
    _, full = roundtrip_fn(1)(x)
    cap = codec.payload_bytes(n, jnp.float32)
    assert enc.payload.shape == (3, cap)
    ok, nbytes, p = np.asarray(enc.ok), np.asarray(enc.nbytes), np.asarray(enc.payload)
    assert ok.tolist() == [False, True, False]
    assert nbytes[0] > cap and nbytes[0] == np.asarray(full.nbytes)[0]
    # over budget: the same bytes as without a budget, cut at the capacity (nothing written past
    # it: the next row, a fitting one, is intact)
    np.testing.assert_array_equal(p[0], np.asarray(full.payload)[0, :cap])
    np.testing.assert_array_equal(p[1, : nbytes[1]], np.asarray(full.payload)[1, : nbytes[1]])
    assert not p[1, nbytes[1] :].any()
    y = jax.jit(lambda q: codec.decode(q, (n,), jnp.float32))(enc.payload[1])
    np.testing.assert_array_equal(bits(y), bits(smooth))
    # a payload over budget is not decodable
    _, status = jax.jit(jax.vmap(lambda q: decode_flat(q, n, jnp.float32, 1, strict=False)))(
        enc.payload
    )
    assert np.asarray(status).tolist() == [BAD_USED, OK, BAD_USED]


def test_large_row_split_across_threads(device):
    # 400k words = 391 chunks: the CPU encoder splits the row over its threads (runs of 64
    # chunks, coded in place or staged); budgets cut it inside the first run and after it.
    n = 400_000
    x = np.cumsum(np.random.default_rng(7).normal(size=n)).astype(np.float32)
    xd = jax.device_put(x, device)
    full = jax.jit(Mpc().encode)(xd)
    used = int(full.nbytes)
    assert used < 0.8 * x.nbytes
    y = jax.jit(lambda p: Mpc().decode(p, (n,), jnp.float32))(full.payload)
    np.testing.assert_array_equal(bits(y), bits(x))
    for frac in (0.2, 0.75):
        codec = Mpc(budget=frac * used / x.nbytes)
        enc = jax.jit(codec.encode)(xd)
        cap = enc.payload.shape[0]
        assert not bool(enc.ok) and int(enc.nbytes) == used
        np.testing.assert_array_equal(np.asarray(enc.payload), np.asarray(full.payload)[:cap])
    # two bad chunks, one in each half: the lower one is reported
    p = np.asarray(full.payload).copy()
    head = _native.cpu.mpc_header_bytes(n, 4)
    ends = p[16 : 16 + 4 * 391].view(np.uint32)
    for c in (300, 10):
        p[head + ends[c - 1]] ^= 0x40  # top word: its bitmap count no longer fits the size
    p = jax.device_put(p, device)
    _, st = jax.jit(lambda q: decode_flat(q, n, jnp.float32, 1, strict=False))(p)
    assert int(st) == BAD_STREAM
    where = "row 0, chunk 10" if device.platform == "cpu" else "the payload"
    with pytest.raises(DECODE_ERRORS, match=rf"mpc decode: {where}: chunk stream"):
        jax.jit(lambda q: Mpc().decode(q, (n,), jnp.float32))(p).block_until_ready()


def test_jit_vmap_match_single_rows(device):
    rng = np.random.default_rng(2)
    x = jax.device_put(patterns(jnp.bfloat16, 1500, rng), device)
    codec = Mpc(dim=2)
    batched = jax.jit(jax.vmap(codec.encode))(x)
    for i in range(x.shape[0]):
        single = jax.jit(codec.encode)(x[i])
        np.testing.assert_array_equal(np.asarray(batched.payload[i]), np.asarray(single.payload))
        assert int(batched.nbytes[i]) == int(single.nbytes)
    y = jax.jit(jax.vmap(lambda p: codec.decode(p, (1500,), jnp.bfloat16)))(batched.payload)
    np.testing.assert_array_equal(bits(y), bits(x))
    # a 2-D batch through nested vmap
    x2 = x[:8].reshape(2, 4, 1500)
    enc2 = jax.vmap(jax.vmap(codec.encode))(x2)
    y2 = jax.vmap(jax.vmap(lambda p: codec.decode(p, (1500,), jnp.bfloat16)))(enc2.payload)
    np.testing.assert_array_equal(bits(y2), bits(x2))


def test_shard_map_8_devices():
    devices = jax.devices("cpu")
    if len(devices) < 8:
        pytest.skip("needs 8 host devices (tests/conftest.py sets them)")
    mesh = Mesh(np.array(devices[:8]), ("data",))
    codec = Mpc(budget=0.9)
    x = np.cumsum(np.random.default_rng(3).normal(size=(8, 3000)), axis=1).astype(np.float32)

    def step(xs):  # encode the local shard, gather every payload, decode all
        enc = codec.encode(xs[0])
        payloads = jax.lax.all_gather(enc.payload, "data")
        ok = jax.lax.all_gather(enc.ok, "data")
        ys = jax.vmap(lambda p: codec.decode(p, (3000,), jnp.float32))(payloads)
        return ys[None], ok[None]

    f = jax.jit(
        jax.shard_map(step, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False)
    )
    ys, ok = f(jax.device_put(x, NamedSharding(mesh, P("data"))))
    assert np.asarray(ok).all()
    for r in range(8):
        np.testing.assert_array_equal(bits(ys[r]), bits(x))


def _corrupt(p: np.ndarray, what: str) -> np.ndarray:
    q = p.copy()
    head = 24  # 16 + 4 * 2 chunks, 8-aligned
    if what == "magic":
        q[0] ^= 1
    elif what == "word":
        q[4] = 2
    elif what == "count":
        q[8] += 1
    elif what == "used":
        q[12:16] = (q[12:16].view(np.uint32) + 4).view(np.uint8)
    elif what == "table":  # chunk 0 said to end past the last chunk
        q[16:20] = np.array([0xFFFF0000], np.uint32).view(np.uint8)
    elif what == "stream":
        q[head + 4] ^= 0x10  # first bitmap word of chunk 0
    elif what == "zero_word":  # a stored word zeroed though the bitmap marks it nonzero
        nb = bin(int(q[head : head + 4].view(np.uint32)[0])).count("1")
        start = head + 4 + 4 * nb
        q[start : start + 4] = 0
    return q


def test_decode_errors(device):
    n = 1500  # two chunks, the second partial
    x = np.cumsum(np.random.default_rng(4).normal(size=n)).astype(np.float32)
    codec = Mpc()
    p = np.asarray(jax.jit(codec.encode)(jax.device_put(x, device)).payload)
    cases = {
        "magic": BAD_MAGIC,
        "word": BAD_WORD,
        "count": BAD_COUNT,
        "used": BAD_USED,
        "table": BAD_TABLE,
        "stream": BAD_STREAM,
        "zero_word": BAD_STREAM,
    }
    rows = np.stack([p] + [_corrupt(p, k) for k in cases])
    dec = jax.jit(jax.vmap(lambda q: decode_flat(q, n, jnp.float32, 1, strict=False)))
    y, status = dec(jax.device_put(rows, device))
    assert np.asarray(status).tolist() == [OK, *cases.values()]
    np.testing.assert_array_equal(bits(y[0]), bits(x))
    assert not np.asarray(y[1:]).any()
    # the dim must match the encoder's
    _, st = jax.jit(lambda q: decode_flat(q, n, jnp.float32, 2, strict=False))(rows[0])
    assert int(st) == BAD_DIM
    # Mpc.decode: a one-line error naming the first bad row (and chunk, on CPU) on every platform
    rows = jax.device_put(rows, device)
    cpu = device.platform == "cpu"
    strict = jax.jit(lambda q: Mpc().decode(q, (n,), jnp.float32))
    with pytest.raises(DECODE_ERRORS, match=r"mpc decode: .*: not an MPC v1 payload"):
        strict(rows[1]).block_until_ready()
    where = "row 0, chunk 0" if cpu else "the payload"
    with pytest.raises(DECODE_ERRORS, match=rf"mpc decode: {where}: chunk stream"):
        strict(rows[6]).block_until_ready()
    with pytest.raises(DECODE_ERRORS, match=r"mpc decode: row 1: not an MPC"):
        jax.jit(jax.vmap(lambda q: Mpc().decode(q, (n,), jnp.float32)))(
            rows[:3]
        ).block_until_ready()
    good = jax.jit(jax.vmap(lambda q: Mpc().decode(q, (n,), jnp.float32)))(rows[:1])
    np.testing.assert_array_equal(bits(good[0]), bits(x))


def test_partial_chunk_padding_checked(device):
    # A hand-made payload of n=5 words whose one chunk stream decodes to nonzero words past the
    # 5th (which the encoder always leaves zero): e[31] = 7 makes every later y, and so words
    # beyond 5 after the transpose, nonzero.
    n, head = 5, 24
    stream = np.array([1, 1 << 31, 7], np.uint32).view(np.uint8)  # top, bitmap word 0, e[31]
    fixed = np.frombuffer(b"MPC\x01\x04\x01\x00\x00", np.uint8)
    sizes = np.array([n, head + stream.size, stream.size, 0], np.uint32).view(np.uint8)
    row = np.concatenate([fixed, sizes, stream])
    row = np.pad(row, (0, Mpc().payload_bytes(n, jnp.float32) - row.size))
    _, st = jax.jit(lambda q: decode_flat(q, n, jnp.float32, 1, strict=False))(
        jax.device_put(row, device)
    )
    assert int(st) == BAD_PAD


def test_fuzz_decoder(device):
    counts = fuzz_mpc.run(cases=12_000, seed=5, batch=2000, device=device)
    assert counts.sum() == 12_000
    assert counts[OK] > 0 and (counts[1:] > 0).sum() >= 6  # the fuzz reaches most checks


@pytest.mark.slow
def test_fuzz_decoder_long(device):
    fuzz_mpc.run(cases=300_000, seed=6, batch=4096, device=device)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no GPU")
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_gpu_payloads_are_the_cpu_payloads(dtype):
    # Two backends, one pipeline: the same bytes for every bit pattern, dim and size (budget cuts
    # included), and each decodes the other's payloads.
    rng = np.random.default_rng(11)
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    for n in (1, 33, 1023, 1025, 3000, 70_000):
        x = patterns(dtype, n, rng)
        for codec in (Mpc(), Mpc(dim=3), Mpc(dim=64), Mpc(budget=0.5)):
            enc = jax.jit(jax.vmap(codec.encode))
            on_cpu, on_gpu = enc(jax.device_put(x, cpu)), enc(jax.device_put(x, gpu))
            for field in ("payload", "nbytes", "ok"):
                np.testing.assert_array_equal(
                    np.asarray(getattr(on_gpu, field)),
                    np.asarray(getattr(on_cpu, field)),
                    err_msg=f"{codec.spec} n={n} {field}",
                )
            one = functools.partial(decode_flat, n=n, dtype=x.dtype, dim=codec.dim, strict=False)
            dec = jax.jit(jax.vmap(one))
            y, status = dec(jax.device_put(np.asarray(on_cpu.payload), gpu))
            fits = np.asarray(on_cpu.ok)
            assert (np.asarray(status)[fits] == OK).all()
            np.testing.assert_array_equal(bits(np.asarray(y)[fits]), bits(x[fits]))


def test_host_check_of_the_status():
    # The GPU's decode path (a host callback on the status) run on the CPU: bit-exact when every
    # status is 0 (-0.0 and NaN payloads in the first word included), else a one-line error.
    x = np.array([[-0.0, 1, 2], [np.nan, 3, 4]], np.float32)
    x[1, 0] = np.array([0x7FC12345], np.uint32).view(np.float32)[0]
    check = jax.jit(jax.vmap(checked_on_host))
    y = check(x, np.zeros(2, np.int32))
    np.testing.assert_array_equal(bits(y), bits(x))
    with pytest.raises(DECODE_ERRORS, match=r"mpc decode: row 1: chunk table is corrupt"):
        check(x, np.array([0, BAD_TABLE], np.int32)).block_until_ready()
    assert status_message(BAD_PAD) == "chunk stream has nonzero padding"
