"""Seeded random bad (and good) input to every public entry point: codec spec strings, policy
mappings and YAML, the `jaxhc train` command line, and the collectives (odd shapes, dtypes, axis
arguments, codecs) against `jax.lax`.

Every case either works (and then agrees with the oracle: a round trip, `jax.lax`) or raises
one line naming the culprit; any other exception, a crash, or a wrong result fails. The cases
are bounded to keep each test to seconds; ``JAXHC_FUZZ_SCALE=100`` runs a hundred times as many
(with other seeds: ``JAXHC_FUZZ_SEED``).
"""

from __future__ import annotations

import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jaxhc
from jaxhc import cli
from jaxhc.codecs import Codec, Mpc, parse
from jaxhc.policy import Policy

SCALE = int(os.environ.get("JAXHC_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("JAXHC_FUZZ_SEED", "0"))


def cases(n: int, salt: str):
    """`n * SCALE` seeded random generators, one per case (a failing case names its seed)."""
    for i in range(n * SCALE):
        yield f"{SEED}/{salt}/{i}", random.Random(f"{SEED}/{salt}/{i}")


def check_message(error: Exception, culprit: str | None, where: str) -> str:
    """`error` is one line naming `culprit` (when given)."""
    message = str(error)
    assert message and "\n" not in message.strip(), f"{where}: {message!r}"
    assert culprit is None or culprit in message, f"{where}: {culprit!r} not in {message!r}"
    return message


def one_line_error(call, culprit: str | None, where: str) -> str:
    """`call()` raises ValueError (TypeError for a wrong argument type), in one line naming
    `culprit` (when given)."""
    try:
        call()
    except (ValueError, TypeError) as e:
        return check_message(e, culprit, where)
    raise AssertionError(f"{where}: no error (culprit {culprit!r})")


# --- codec spec strings ---------------------------------------------------------------------------

NAMES = ["zfp", "mpc", "q8", "q4", "none", "identity", "raw", "ZFP", " zfp", "zfpp", "", "q16"]
ARGS = ["8", "0", "-1", "2", "2.25", "2.2", "32", "64", "65", "1e9", "nan", "inf", "-inf", "0.5",
        "1.5", "abc", "", "dim=2", "dim=0", "dim=-3", "dim=x", "dim=9", "b128", "b0", "b7", "b-4",
        "bx", "b1000000000000", "8.5", " 8", "0x10", "1_0", "h", "h", "b64", "b1024"]  # fmt: skip
NOT_STRINGS = [8, 8.0, True, b"zfp:8", ["zfp", 8], {"codec": "zfp"}, object()]


def random_spec(rng: random.Random):
    if rng.random() < 0.1:
        return rng.choice(NOT_STRINGS)
    args = [rng.choice(ARGS) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
    return ":".join([rng.choice(NAMES), *args])


def test_fuzz_codec_specs():
    """parse() returns a codec whose spec parses back to it, which then encodes and decodes a
    small array (lossless ones bit-exactly), or raises one line quoting the spec."""
    accepted = 0
    for where, rng in cases(400, "spec"):
        spec = random_spec(rng)
        try:
            codec = parse(spec)
        except ValueError as e:
            check_message(e, repr(spec), where)
            continue
        assert isinstance(codec, Codec), (where, spec, codec)
        assert parse(codec.spec) == codec, (where, spec, codec)
        if accepted < 12 * SCALE:  # the native coders on what the parser let through
            accepted += 1
            n = rng.choice([1, 3, 4, 5, 17, 256, 1000])
            x = np.random.default_rng(accepted).standard_normal(n).astype(np.float32)
            try:
                enc = codec.encode(jnp.asarray(x))
            except ValueError as e:  # a spec valid for some dtypes only (zfp:64 is float64's)
                check_message(e, "float32", f"{where} {spec!r}")
                continue
            if not bool(enc.ok):  # over an MPC budget: the collectives send it raw instead
                assert isinstance(codec, Mpc) and codec.budget is not None, (where, spec)
                continue
            y = np.asarray(codec.decode(enc.payload, x.shape, x.dtype))
            assert y.shape == x.shape, (where, spec)
            if codec.lossless:
                assert y.tobytes() == x.tobytes(), (where, spec)
            else:
                assert np.abs(y - x).max() <= 0.1 * np.abs(x).max(), (where, spec)
    assert accepted > 0


# --- hostile payloads for the rotated quantizers --------------------------------------------------

# Scale bit patterns at and around the edges of what a decoder takes ([2^-123, 2^98)).
SCALE_BITS = [
    *(0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x00000001, 0x007FFFFF),
    *((4 << 23) - 1, 4 << 23, (225 << 23) - 1, 225 << 23, 0x3F800000, 0xBF800000),
]


def _hostile(rng: random.Random, payload: np.ndarray, blocks: int) -> np.ndarray:
    """A payload with random bytes, flipped bits, or edge-case scales written over it."""
    p = payload.copy()
    op = rng.choice(["bytes", "bits", "scales", "all"])
    if op == "bytes":
        for _ in range(rng.randint(1, 16)):
            p[rng.randrange(p.size)] = rng.randrange(256)
    elif op == "bits":
        for _ in range(rng.randint(1, 32)):
            p[rng.randrange(p.size)] ^= 1 << rng.randrange(8)
    elif op == "scales":
        scales = p[: 4 * blocks].view(np.uint32)
        for _ in range(rng.randint(1, blocks)):
            scales[rng.randrange(blocks)] = rng.choice(SCALE_BITS)
    else:
        p[:] = np.frombuffer(rng.randbytes(p.size), np.uint8)
    return p


def test_fuzz_rotated_quant_decode(monkeypatch):
    """q8:h / q4:h payloads with hostile bytes decode on every CPU kernel to what the numpy
    oracle decodes, bit for bit, to finite float32 values (a scale out of range: zeros); the
    fused decode-and-sum of such payloads equals decoding them and adding in rank order."""
    from _quant_oracle import rotated_decode

    from jaxhc import _native

    for where, rng in cases(12, "rotated"):
        bits, block = rng.choice([4, 8]), rng.choice([64, 256, 1024])
        dtype = rng.choice([np.float32, jnp.bfloat16, np.float16])
        codec = parse(f"q{bits}:b{block}:h")
        n = rng.choice([1, 63, 300, 2 * block + 5])
        blocks = -(-n // block)
        x = np.random.default_rng(rng.randrange(2**32)).standard_normal((2, n)).astype(dtype)
        good = np.asarray(jax.vmap(codec.encode)(jnp.asarray(x)).payload)
        bad = np.stack([_hostile(rng, row, blocks) for row in good])
        levels, _ = _native.cpu.quant_levels(bits)
        want = [rotated_decode(row.tobytes(), n, bits, block, levels, dtype) for row in bad]
        for kernel in _native.cpu.quant_kernels():
            monkeypatch.setenv("JAXHC_QUANT_KERNEL", kernel)
            for row, w in zip(bad, want, strict=True):
                got = np.asarray(codec.decode(jnp.asarray(row), (n,), dtype))
                assert got.tobytes() == w.tobytes(), f"{where} {codec.spec} {kernel}"
                if dtype != np.float16:  # float16 rounds values past 65504 to inf, as astype
                    assert np.isfinite(got.astype(np.float32)).all(), where
            fused = codec.decode_sum(jnp.asarray(bad), n, dtype)
            unfused = Codec.decode_sum(codec, jnp.asarray(bad), n, dtype)
            assert np.asarray(fused).tobytes() == np.asarray(unfused).tobytes(), where


# --- policies: mappings and YAML files ------------------------------------------------------------


def _policy_fault(rng: random.Random):
    """A policy mapping with one fault, and the text its error must contain."""
    axis = rng.choice(["data", "tensor", "pipe"])
    good = {"name": "p", "min_bytes": 0, "axes": {axis: {"codec": "zfp", "rate": 8}}}
    faults = [
        ({**good, "min_byte": 0}, "'min_byte'"),
        ({**good, 3: "x"}, "3"),
        ({**good, 3: "x", "zz": 1}, "unknown key"),
        *[({**good, "min_bytes": v}, "min_bytes") for v in (-1, "64k", 1.5, True, [1])],
        ({**good, "axes": ["data"]}, "'axes'"),
        ({**good, "axes": {axis: "zfp:1"}}, "'zfp:1'"),
        ({**good, "axes": {axis: 12}}, "12"),
        ({**good, "axes": {axis: ["zfp", 8]}}, "axes." + axis),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": 8, "rat": 3}}}, "'rat'"),
        ({**good, "axes": {axis: {"codec": "zfp"}}}, "rate"),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": "x"}}}, "axes." + axis),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": float("nan")}}}, "axes." + axis),
        ({**good, "axes": {axis: {"codec": "gzip"}}}, "'gzip'"),
        ({**good, "axes": {axis: {"codec": "mpc", "budget": 3}}}, "axes." + axis),
        ({**good, "axes": {axis: {"codec": "mpc", "dim": 0}}}, "axes." + axis),
        ({**good, "axes": {axis: {"codec": "q8", "block": 3}}}, "axes." + axis),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": 8, "error_feedback": "y"}}}, "'y'"),
        ({**good, "axes": {axis: {"codec": "mpc", "error_feedback": True}}}, "error_feedback"),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": 8, "grad": "zfp:0"}}}, "'zfp:0'"),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": 8, "params": "mpc"}}}, "'params'"),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": 8, 7: "mpc"}}}, "7"),
        ({**good, "axes": {axis: {"codec": "zfp", "rate": 8, 7: "mpc", "r": 1}}}, "unknown key"),
        ("zfp:8", "expected a mapping"),
    ]
    return rng.choice(faults)


def test_fuzz_policy_mappings():
    for where, rng in cases(120, "policy"):
        data, culprit = _policy_fault(rng)
        one_line_error(lambda data=data: Policy.from_dict(data, name="p"), culprit, where)


YAML_TEXT = """\
name: fuzz
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8, error_feedback: true}
  tensor: {codec: mpc, budget: 0.9}
  pipe: "q8:b128"
"""


def test_fuzz_policy_yaml_files(tmp_path):
    """A good policy file with bytes replaced, dropped or cut off: it loads (and then means what
    it says: a round trip through to_dict) or the error is one line naming the file."""
    good = Policy.from_yaml(_write(tmp_path / "good.yaml", YAML_TEXT))
    assert Policy.from_dict(good.to_dict(), name="fuzz") == good
    for where, rng in cases(150, "yaml"):
        text = list(YAML_TEXT)
        for _ in range(rng.randint(1, 3)):
            if not text:
                break
            i = rng.randrange(len(text))
            op = rng.choice(["replace", "drop", "cut"])
            if op == "replace":
                text[i] = rng.choice(":{}[],'\"\t -#&*!|>%@`0a\x00\u00e9")
            elif op == "drop":
                del text[i]
            else:
                text = text[:i]
        path = _write(tmp_path / f"p{rng.randrange(10**9)}.yaml", "".join(text))
        try:
            policy = Policy.load(path)
        except ValueError as e:
            check_message(e, path, where)
            continue
        assert Policy.from_dict(policy.to_dict(), name=policy.name) == policy, where


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- the command line -----------------------------------------------------------------------------

CLI_FAULTS = [
    (["--steps", "0"], "train.steps=0"),
    (["--steps", "-3"], "train.steps=-3"),
    (["--mesh", "data=2,tensr=2"], "--mesh"),
    (["--mesh", "data=two"], "'two'"),
    (["--mesh", "data=3,tensor=1,pipe=1"], "3"),
    (["--mesh", "data=0,tensor=1,pipe=1"], "mesh.data=0"),
    (["--compression", "zhybird"], "'zhybird'"),
    (["--compression", "missing/policy.yaml"], "missing/policy.yaml"),
    (["--config", "missing.yaml"], "missing.yaml"),
    (["--log-every", "0"], "--log-every 0"),
    (["model.n_layr=2"], "model.n_layr"),
    (["modle.n_layer=2"], "'modle'"),
    (["model.n_head=3"], "model.n_head=3"),
    (["model.n_embd=-8"], "model.n_embd"),
    (["model.dtype=float8"], "float8"),
    (["optim.lr=fast"], "optim.lr"),
    (["train.batch_size=7"], "train.batch_size=7"),
    (["train.max_skipped_steps=-1"], "train.max_skipped_steps=-1"),
    (["train.seed=1.5"], "train.seed=1.5"),
    (["train=3"], "'train'"),
    (["transport=carrier-pigeon"], "carrier-pigeon"),
    (["n_layer"], "n_layer"),
]


def test_fuzz_train_command_line(capsys, monkeypatch):
    """`jaxhc train` with one bad flag or override among good ones: exit status 2 and one line
    naming it, before anything trains."""

    def no_training(*args, **kwargs):
        raise AssertionError("a bad command line reached training")

    # Past every check (config, mesh against the devices, batch), the loop would start: not here.
    monkeypatch.setattr("jaxhc.train.loop.run_loop", no_training)
    monkeypatch.setattr("jaxhc.train.mpi.run_loop", no_training)
    fine = [
        ["model.n_layer=2"],
        ["--steps", "3"],
        ["--no-progress"],
        ["--mesh", "data=2"],
        ["--compression", "zfp8"],
        ["train.eval_every=1"],
        ["--out", "/nonexistent/run"],
    ]
    for where, rng in cases(60, "cli"):
        args, culprit = rng.choice(CLI_FAULTS)
        others = [f for f in fine if f[0] != args[0]]  # a repeated flag would hide the fault
        parts = [args] + rng.sample(others, rng.randint(0, 3))
        rng.shuffle(parts)
        argv = ["train"] + [a for part in parts for a in part]
        capsys.readouterr()
        try:
            status = cli.main(argv)
        except SystemExit as e:  # argparse: usage and one error line
            status = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2, (where, argv, err)
        assert err and culprit in err[-1], (where, argv, err)
        assert err[-1].startswith(("jaxhc train: error:", "jaxhc: error:")), (where, argv, err)


# --- the collectives against jax.lax --------------------------------------------------------------

PARTS = 2  # a ("data",) mesh of 2 host devices: small programs, quick to trace and compile
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.int8, jnp.uint8, jnp.bool_]
CODECS = [None, "none", "mpc", "mpc:0.9", "zfp:8", "zfp:16", "q8", "q4:b32", "q4:h"]
BAD_CODECS = ["zfp:1", "zfp", "mpc:7", "gzip", "q8:b3", "q4:b32:h"]


def _collective(rng: random.Random, shape):
    """(name, jaxhc call, lax call, culprit of an injected fault or None) for one random case."""
    ndim = len(shape)
    dim = rng.randint(-ndim - 1, ndim + 1) if ndim else rng.randint(-1, 1)
    tiled = rng.random() < 0.5
    name = rng.choice(["psum", "pmean", "all_gather", "psum_scatter", "ppermute", "all_to_all"])
    if name in ("psum", "pmean"):
        return name, {}, {}
    if name == "all_gather":
        return name, {"axis": dim, "tiled": tiled}, {"axis": dim, "tiled": tiled}
    if name == "psum_scatter":
        kw = {"scatter_dimension": dim, "tiled": tiled}
        # lax.psum_scatter traces a negative scatter_dimension, then fails to lower it (jax
        # 0.10.2); jaxhc normalizes it, so the oracle gets it normalized too.
        return name, kw, {**kw, "scatter_dimension": dim % ndim if -ndim <= dim < 0 else dim}
    if name == "ppermute":
        perm = rng.choice([[(0, 1), (1, 0)], [(0, 1)], [(1, 1)], [], [(0, 1), (1, 1)], [(0, 2)]])
        return name, {"perm": perm}, {"perm": perm}
    concat = rng.randint(-ndim, ndim) if ndim else 0
    kw = {"split_axis": dim, "concat_axis": concat, "tiled": tiled}
    # jax 0.10.2's lax.all_to_all kills the process (SIGSEGV) for a negative split_axis or
    # concat_axis in range; jaxhc normalizes them, so the oracle gets them normalized too.
    lax_kw = {
        **kw,
        **{k: kw[k] % ndim for k in ("split_axis", "concat_axis") if -ndim <= kw[k] < 0},
    }
    return name, kw, lax_kw


def _trace(fn, x, mesh):
    """The per-shard `fn` mapped over the mesh: traced only (an error or the output type)."""
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False)
    return jax.eval_shape(mapped, x)


def _lower(fn, x, mesh):
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False)
    return jax.jit(mapped).lower(x)


@pytest.mark.parametrize("round_", range(3))
def test_fuzz_collectives_against_lax(round_):
    """Random collective, per-shard shape (0-d included), dtype, axis arguments, codec spec and
    axis name: where jax.lax accepts the call, jaxhc gives the same type and, run, the same values
    (bit-exact for plain / lossless codecs and non-float dtypes; within a loose bound for lossy
    ones); where jax.lax refuses it, or the codec spec or axis name is bad, jaxhc raises one line
    (naming the spec or axis where that was the fault)."""
    mesh = Mesh(np.asarray(jax.devices()[:PARTS]), ("data",))
    ran = 0
    for where, rng in cases(25, f"collectives{round_}"):
        shape = tuple(rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.choice([0, 1, 1, 2, 3])))
        dtype = rng.choice(DTYPES)
        data = np.random.default_rng(rng.randrange(2**32)).standard_normal((PARTS, *shape)) * 3
        x = jnp.asarray(data).astype(dtype)
        name, kw, lax_kw = _collective(rng, shape)
        codec, axis, culprit = rng.choice(CODECS), "data", None
        if rng.random() < 0.15:
            codec = culprit = rng.choice(BAD_CODECS)
        elif rng.random() < 0.1:
            axis = culprit = rng.choice(["dta", "tensor"])
        ours = getattr(jaxhc, name)
        theirs = getattr(lax, name)

        def mine(v, ours=ours, kw=kw, codec=codec, axis=axis):
            return ours(v[0], axis, codec=codec, **kw)[None]

        def oracle(v, theirs=theirs, kw=lax_kw, axis=axis):
            v = v[0]
            if theirs is lax.pmean and not jnp.issubdtype(v.dtype, jnp.inexact):
                return theirs(v, axis)[None]
            return theirs(v, axis, **kw)[None]

        case = f"{where}: {name}{shape} {jnp.dtype(dtype).name} {kw} codec={codec!r} axis={axis!r}"
        try:
            want = _trace(oracle, x, mesh)
            if culprit is not None:  # some faults lax finds only when it lowers the program
                _lower(oracle, x, mesh)
        except Exception:  # noqa: BLE001 - jax.lax refuses it; jaxhc must refuse it clearly
            want = None
        if want is None or culprit is not None:
            # The culprit is named when it is the only fault (jax.lax takes the rest).
            shown = None if want is None else repr(culprit) if culprit in BAD_CODECS else culprit
            try:
                _trace(mine, x, mesh)
            except (ValueError, TypeError, NameError) as e:
                check_message(e, shown, case)
                continue
            raise AssertionError(f"{case}: jaxhc accepted what jax.lax refuses")
        try:
            got = _trace(mine, x, mesh)
        except (ValueError, TypeError) as e:  # stricter than lax's tracing: lax must fail later
            check_message(e, None, case)
            with pytest.raises(Exception):  # noqa: B017 - whatever jax raises when it lowers
                _lower(oracle, x, mesh)
            continue
        assert (got.shape, got.dtype) == (want.shape, want.dtype), case
        if ran < 6 * SCALE:  # compile and run a few, for the values
            ran += 1
            step = jax.jit(
                jax.shard_map(
                    lambda a, b: (mine(a), oracle(b)),
                    mesh=mesh,
                    in_specs=(P("data"), P("data")),
                    out_specs=(P("data"), P("data")),
                    check_vma=False,
                )
            )
            got, want = (np.asarray(v.astype(jnp.float32)) for v in step(x, x))
            c = parse(codec)
            if c is None or c.lossless or not jnp.issubdtype(dtype, jnp.floating):
                assert got.tobytes() == want.tobytes(), case
            else:
                bound = 0.1 * PARTS * np.abs(np.asarray(x.astype(jnp.float32))).max()
                assert np.abs(got - want).max() <= bound, case
