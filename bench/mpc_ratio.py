"""MPC compression ratios on realistic data, and encode/decode speed through the FFI inside jit.

Data (self-contained, seeded): the weights of a small GPT-2-like model at its usual init (N(0, 0.02)
matrices, 0.02/sqrt(2L) output projections, LayerNorm ones and zeros, zero biases), its gradients
and activations for one batch of random tokens (jax.grad of the next-token loss), random walks,
a smooth 2-D field, and white noise; each as float32 and bfloat16, for dim 1, 2 and 4.
Ratio = raw bytes / bytes used by the payload, summed over the arrays of a data set.

    .venv/bin/python bench/mpc_ratio.py --out bench/results/mpc_ratio.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxhc.codecs import Mpc

DIMS = (1, 2, 4)
DTYPES = ("float32", "bfloat16")


def gpt_params(key, vocab=4096, d=256, layers=4, ctx=128):
    """GPT-2-style parameters at init, as a dict of arrays."""
    keys = iter(jax.random.split(key, 4 + 4 * layers))
    normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape)  # noqa: E731
    proj = 0.02 / np.sqrt(2 * layers)
    p = {"wte": normal((vocab, d)), "wpe": normal((ctx, d), 0.01)}
    for i in range(layers):
        p[f"h{i}"] = {
            "ln1_g": jnp.ones(d),
            "ln1_b": jnp.zeros(d),
            "attn_w": normal((d, 3 * d)),
            "attn_b": jnp.zeros(3 * d),
            "attn_proj": normal((d, d), proj),
            "attn_proj_b": jnp.zeros(d),
            "ln2_g": jnp.ones(d),
            "ln2_b": jnp.zeros(d),
            "fc": normal((d, 4 * d)),
            "fc_b": jnp.zeros(4 * d),
            "fc_proj": normal((4 * d, d), proj),
            "fc_proj_b": jnp.zeros(d),
        }
    p["lnf_g"], p["lnf_b"] = jnp.ones(d), jnp.zeros(d)
    return p


def _ln(x, g, b):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b


def gpt_forward(p, tokens, heads=4):
    """Logits and the per-layer activations (MLP hidden states, residual stream)."""
    t = tokens.shape[1]
    x = p["wte"][tokens] + p["wpe"][:t]
    acts = []
    mask = jnp.tril(jnp.ones((t, t), bool))
    for i in range(sum(k.startswith("h") for k in p)):
        h = p[f"h{i}"]
        q, k, v = jnp.split(_ln(x, h["ln1_g"], h["ln1_b"]) @ h["attn_w"] + h["attn_b"], 3, -1)
        split = lambda a: a.reshape(*a.shape[:2], heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
        att = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1] // heads)
        att = jax.nn.softmax(jnp.where(mask, att, -1e9), -1) @ split(v)
        x = x + att.transpose(0, 2, 1, 3).reshape(x.shape) @ h["attn_proj"] + h["attn_proj_b"]
        hid = jax.nn.gelu(_ln(x, h["ln2_g"], h["ln2_b"]) @ h["fc"] + h["fc_b"], approximate=True)
        x = x + hid @ h["fc_proj"] + h["fc_proj_b"]
        acts += [hid, x]
    return _ln(x, p["lnf_g"], p["lnf_b"]) @ p["wte"].T, acts


def datasets(n: int, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Name -> list of float32 arrays."""
    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed)
    params = gpt_params(key)
    tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (8, 128), 0, 4096)

    def loss(p):
        logits, _ = gpt_forward(p, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    grads = jax.grad(loss)(params)
    _, acts = gpt_forward(params, tokens[:, :-1])
    side = int(np.sqrt(n))
    u, v = np.meshgrid(np.linspace(0, 4, side), np.linspace(0, 3, side))
    field = np.sin(3 * u) * np.cos(2 * v) + np.exp(-((u - 2) ** 2 + (v - 1.5) ** 2))
    as_np = lambda tree: [np.asarray(a, np.float32) for a in jax.tree.leaves(tree)]  # noqa: E731
    return {
        "gpt weights": as_np(params),
        "gpt gradients": as_np(grads),
        "gpt activations": as_np(acts),
        "random walk": [np.cumsum(rng.normal(size=n)).astype(np.float32)],
        "smooth 2-D field": [field.astype(np.float32)],
        "white noise": [rng.normal(size=n).astype(np.float32)],
    }


def ratio(arrays: list[np.ndarray], dtype: str, dim: int) -> float:
    codec = Mpc(dim=dim)
    raw = used = 0
    for a in arrays:
        x = jnp.asarray(a, dtype)
        raw += x.nbytes
        used += int(jax.jit(codec.encode)(x).nbytes)
    return raw / used


def speed(n: int, reps: int) -> dict:
    """Best-of-reps encode / decode GB/s (uncompressed bytes) of n float32 values under jit."""
    rng = np.random.default_rng(1)
    t = np.linspace(0, 60, n)
    data = {
        "smooth": (np.sin(t) + 0.1 * np.sin(37 * t)).astype(np.float32),
        "gpt-like weights": rng.normal(0, 0.02, n).astype(np.float32),
    }
    codec = Mpc()
    enc = jax.jit(codec.encode)
    dec = jax.jit(lambda p: codec.decode(p, (n,), jnp.float32))
    out = {}
    for name, a in data.items():
        x = jnp.asarray(a)
        e = jax.block_until_ready(enc(x))
        y = jax.block_until_ready(dec(e.payload))
        assert bool((jax.lax.bitcast_convert_type(y, jnp.uint32) == a.view(np.uint32)).all())
        te, td = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(enc(x))
            t1 = time.perf_counter()
            jax.block_until_ready(dec(e.payload))
            te.append(t1 - t0)
            td.append(time.perf_counter() - t1)
        out[name] = {
            "ratio": x.nbytes / int(e.nbytes),
            "encode_GBps": x.nbytes / min(te) / 1e9,
            "decode_GBps": x.nbytes / min(td) / 1e9,
            "encode_GBps_median": x.nbytes / float(np.median(te)) / 1e9,
            "decode_GBps_median": x.nbytes / float(np.median(td)) / 1e9,
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20, help="values per synthetic data set")
    ap.add_argument("--speed-n", type=int, default=1 << 24, help="float32 values for the speed run")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    sets = datasets(args.n)
    rows = []
    print(f"{'data':18} {'dtype':9} {'MB':>7} " + " ".join(f"{'dim ' + str(d):>7}" for d in DIMS))
    for name, arrays in sets.items():
        for dtype in DTYPES:
            mb = sum(a.size for a in arrays) * jnp.dtype(dtype).itemsize / 1e6
            r = {d: ratio(arrays, dtype, d) for d in DIMS}
            rows.append({"data": name, "dtype": dtype, "MB": mb, **{f"dim{d}": r[d] for d in DIMS}})
            print(f"{name:18} {dtype:9} {mb:7.2f} " + " ".join(f"{r[d]:7.3f}" for d in DIMS))
    result = {"ratios": rows, "cpu_count": os.cpu_count(), "machine": platform.processor()}
    if not args.no_speed:
        result["load_average"] = os.getloadavg()
        result["speed"] = sp = speed(args.speed_n, args.reps)
        print(f"\nfloat32, {args.speed_n} values, jit, best of {args.reps} (median):")
        for name, s in sp.items():
            print(
                f"  {name:17} ratio {s['ratio']:.3f}  encode {s['encode_GBps']:.2f} "
                f"({s['encode_GBps_median']:.2f}) GB/s  decode {s['decode_GBps']:.2f} "
                f"({s['decode_GBps_median']:.2f}) GB/s"
            )
        print(f"  load average before the run: {result['load_average'][0]:.2f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
