"""The fused MPI collectives (ffi/mpi) against the XLA transport, bit for bit, under mpirun.

The fused psum / psum_scatter / all_gather run the whole algorithm in one native call, cut into
segments that overlap encoding, the wire and decoding. Here the segments are made small so every
case spans many of them, with lengths that leave partial chunks, blocks and segments, in float32,
bfloat16 and float64, plain, ZFP, MPC and the block quantizers (q8, q4, rotated q8:h / q4:h); a
NaN in the last segment of one rank (the whole call goes plain on every rank), and sums that
overflow (the gather phase goes plain). Rank 0 computes the reference with the XLA transport on
simulated devices; every rank checks its block bitwise and that the fused call really ran. Under
the fixed-size codecs the wire bytes a rank reports are what the engine's messages hold: each
segment's own payload (the codec's size for its values) behind an 8-byte header.
"""

from __future__ import annotations

import functools

import jax
import mpi_helpers as h
import numpy as np
import pytest
from _tiers import quick
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.mpi]

h.skip_unless_fused_under_mpirun()

from mpi4py import MPI  # noqa: E402

import jaxhc  # noqa: E402
from jaxhc.codecs import parse  # noqa: E402
from jaxhc.partition import local_block  # noqa: E402
from jaxhc.transport import _mpi_fused  # noqa: E402

WORLD = MPI.COMM_WORLD
SIZE = WORLD.Get_size()
SEGMENT_BYTES = 4096  # many segments per chunk at these sizes
TARGETS = {
    "psum": "jaxhc_mpi_psum",
    "psum_scatter": "jaxhc_mpi_psum_scatter",
    "all_gather": "jaxhc_mpi_all_gather",
}


def _body(collective, codec):
    if collective == "psum":
        return lambda x: jaxhc.psum(x, "x", codec=codec)
    if collective == "psum_scatter":
        return lambda x: jaxhc.psum_scatter(x, "x", tiled=True, codec=codec)
    return lambda x: jaxhc.all_gather(x, "x", tiled=True, codec=codec)


@functools.cache
def _programs(collective, codec):
    body = _body(collective, codec)
    spec = P("x")
    xla = jaxhc.Launcher({"x": SIZE}, "xla").shard_map(body, in_specs=spec, out_specs=spec)
    launcher = jaxhc.Launcher({"x": SIZE}, "mpi")
    return xla, launcher, launcher.shard_map(body, in_specs=spec, out_specs=spec), body


def _input(rows_per_rank, cols, dtype, case, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SIZE * rows_per_rank, cols)).astype(np.float32)
    x *= np.geomspace(1e-3, 1e3, x.shape[1], dtype=np.float32)  # mixed magnitudes per block
    if case == "nan":  # the last rank's last values: the last segment of the last chunk
        x[-1, -1] = np.nan
    if case == "overflow":  # every rank's share sums past float32's range (finite inputs)
        x[:, : cols // 2] = 3e38
    if case == "mixed":  # rows MPC compresses well between rows of noise: coded and raw segments
        x[::2] = np.arange(x[::2].size).reshape(-1, cols) % 1000
    if case == "huge":  # finite, but past what a rotated quantizer codes (2^116)
        x[-1, -1] = 1e36
    return x.astype(dtype)


def _traffic(run):
    with jaxhc.accounting.Ledger() as ledger:
        out = jax.block_until_ready(run())
    return out, ledger.per_axis(devices=1).get("x", {})


# Values per segment boundary of the fixed-size codecs in the engine (ffi/mpi/codecs.h: align()).
ALIGN = {"zfp": lambda call: 64 << (2 * call.dim), "quant": lambda call: call.block}
ALIGN["quant:h"] = ALIGN["quant"]


def _engine_wire(collective, codec, dtype, size):
    """Bytes a rank's messages hold in a fused call without fallback on `size` local values,
    counted from the codec's own payload size per segment (not from the engine): 8-byte headers,
    and psum_scatter's agreement (an int32 to each other rank)."""
    codec = parse(codec)
    call, itemsize = codec.native_call(dtype), np.dtype(dtype).itemsize
    align = ALIGN[call.family](call)
    per = {"psum": -(-size // SIZE), "psum_scatter": size // SIZE, "all_gather": size}[collective]
    m = per if collective == "all_gather" else -(-per // 4) * 4  # rows padded as to_rows does
    seg = max(align, -(-(_mpi_fused.SEGMENT_BYTES // itemsize) // align) * align)
    counts = [min(seg, m - b) for b in range(0, m, seg)]
    message = sum(8 + codec.payload_bytes(c, dtype) for c in counts)
    phases = 2 if collective == "psum" else 1
    agree = 4 * (SIZE - 1) if collective == "psum_scatter" else 0
    return phases * (SIZE - 1) * message + agree


def _check(collective, codec, dtype, rows_per_rank, cols, case="plain"):
    x = _input(rows_per_rank, cols, dtype, case)
    xla, launcher, mpi, body = _programs(collective, codec)

    def reference():
        out, traffic = _traffic(lambda: xla(x))
        return np.asarray(out), traffic["fallbacks"] / SIZE, traffic["wire_bytes"] / SIZE

    ref = h.Reference(reference)
    xin = launcher.put(x, P("x"))
    with jaxhc.transport.use(launcher.transport):
        hlo = jax.jit(body).lower(xin).as_text()
    got, traffic = _traffic(lambda: mpi(xin))
    ref, fallbacks_ref, wire_ref = ref.get()
    fallbacks = traffic["fallbacks"]
    want = local_block(P("x"), ref, launcher.grid.coords, launcher.mesh_shape)
    bad = []
    if not h.bits_equal(got, want):
        g, w = np.asarray(got), np.asarray(want)
        diff = int(np.sum(g.view(np.uint8) != w.view(np.uint8))) if g.shape == w.shape else -1
        bad.append(f"{collective} {codec} {dtype.__name__} {case}: {diff} bytes differ")
    if TARGETS[collective] not in hlo:
        bad.append(f"{collective} {codec}: the fused call {TARGETS[collective]} did not run")
    if case == "mixed":  # MPC's budget holds per segment here (per call on the XLA transport)
        if not traffic["wire_bytes"] < 0.9 * traffic["raw_bytes"]:
            bad.append(f"{collective} {codec}: nothing was coded ({traffic})")
        fallbacks_ref = float(codec != "mpc")  # the noise rows go raw over a budget, if any
    if fallbacks != fallbacks_ref:
        bad.append(f"{collective} {codec} {case}: fallbacks {fallbacks} vs XLA's {fallbacks_ref}")
    if codec and not fallbacks and parse(codec).native_call(dtype).family != "mpc":
        # what moved: XLA's payloads (whole rows), cut into segments with a header each
        want_wire = _engine_wire(collective, codec, dtype, x.size // SIZE)
        if not wire_ref <= traffic["wire_bytes"] == want_wire:
            bad.append(
                f"{collective} {codec} {case}: wire {traffic['wire_bytes']}, engine's messages "
                f"{want_wire}, XLA's payloads {wire_ref}"
            )
    everyone = WORLD.allgather(bad)
    lines = [f"rank {r}: {k}" for r, ks in enumerate(everyone) for k in ks]
    assert not lines, "\n".join(lines)


@pytest.fixture(autouse=True)
def _small_segments(monkeypatch):
    monkeypatch.setattr(_mpi_fused, "SEGMENT_BYTES", SEGMENT_BYTES)
    monkeypatch.setattr(_mpi_fused, "PLAIN_SEGMENT_BYTES", SEGMENT_BYTES)
    _programs.cache_clear()


SHAPES = [(1, 1), (1, 7), (3, 339), (8, 1000)]  # per rank: tiny, partial blocks, many segments
CODECS = [None, "zfp:8", "zfp:13.5", "zfp:8:d3", "zfp:5:d2", "mpc", "mpc:0.9:dim=2"]
QUANT = ["q8", "q4:b64", "q8:b1536", "q8:h", "q4:h"]  # q8:b1536: blocks across segment bounds


# The quantizers' tiny shapes (one partial block, as the zfp and mpc cases check it) run in
# `make test-all` alone (CI time: every case is a program compiled on each rank).
# The quick suite: every codec on the shape of partial blocks and several segments, the tiny and
# the many-segment shapes for a few.
CASES = quick(
    [(c, s) for c in CODECS for s in SHAPES]
    + [
        pytest.param(c, s, marks=pytest.mark.slow) if s[0] * s[1] < 64 else (c, s)
        for c in QUANT
        for s in SHAPES
    ],
    {(c, (3, 339)) for c in CODECS + QUANT}
    | {(None, (1, 1)), ("zfp:8", (1, 7)), ("mpc", (1, 7)), ("zfp:8", (8, 1000)), ("q8", (8, 1000))},
)


@pytest.mark.parametrize("collective", sorted(TARGETS))
@pytest.mark.parametrize(
    "codec, shape",
    CASES,
    ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x),
)
def test_fused_matches_xla_float32(collective, codec, shape):
    rows = shape[0] * (SIZE if collective == "psum_scatter" else 1)  # whole tiles to scatter
    _check(collective, codec, np.float32, rows, shape[1])


@pytest.mark.parametrize("collective", sorted(TARGETS))
@pytest.mark.parametrize("codec", [None, "zfp:8", "zfp:8:d3", "mpc", "q8", "q8:h", "q4:h"])
def test_fused_matches_xla_bfloat16(collective, codec):
    import ml_dtypes

    rows = 4 * (SIZE if collective == "psum_scatter" else 1)
    _check(collective, codec, ml_dtypes.bfloat16, rows, 777)


@pytest.mark.parametrize("codec", [None, "zfp:16", "zfp:16:d3", "mpc"])
def test_fused_matches_xla_float64(codec):
    with jax.enable_x64(True):
        _check("psum", codec, np.float64, 2, 1001)


@pytest.mark.parametrize("collective", sorted(TARGETS))
@pytest.mark.parametrize("codec", ["zfp:8", "zfp:8:d3", "q8", "q4:h"])
def test_nan_on_one_rank_makes_every_rank_plain(collective, codec):
    rows = 8 * (SIZE if collective == "psum_scatter" else 1)
    _check(collective, codec, np.float32, rows, 1000, case="nan")


@pytest.mark.parametrize("collective", sorted(TARGETS))
@pytest.mark.parametrize("codec", ["mpc", "mpc:0.6"])
def test_mpc_mixes_coded_and_raw_segments(collective, codec):
    rows = 8 * (SIZE if collective == "psum_scatter" else 1)
    _check(collective, codec, np.float32, rows, 1000, case="mixed")


@pytest.mark.parametrize("collective", sorted(TARGETS))
def test_a_value_rotation_cannot_code_makes_every_rank_plain(collective):
    rows = 8 * (SIZE if collective == "psum_scatter" else 1)
    _check(collective, "q8:h", np.float32, rows, 1000, case="huge")


@pytest.mark.parametrize("codec", ["zfp:8", "q8"])
def test_overflowing_sum_gathers_plain(codec):
    _check("psum", codec, np.float32, 8, 1000, case="overflow")


@pytest.mark.parametrize("collective", sorted(TARGETS))
@pytest.mark.parametrize("codec", [None, "zfp:8", "mpc", "q4:h"])
def test_messages_of_many_pieces(collective, codec, monkeypatch):
    # Messages longer than the engine's MPI piece (just under 64 KiB) go as several pieces, the
    # coded ones with empty pieces after their payload: 256 KiB segments of ~1.3 MB per rank.
    monkeypatch.setattr(_mpi_fused, "SEGMENT_BYTES", 1 << 18)
    monkeypatch.setattr(_mpi_fused, "PLAIN_SEGMENT_BYTES", 1 << 18)
    _programs.cache_clear()
    rows = 8 * (SIZE if collective == "psum_scatter" else 1)
    case = "mixed" if codec == "mpc" else "plain"
    _check(collective, codec, np.float32, rows, 40_000 + 3, case=case)
