"""The stages of the GPU check (`make gpu-check`, bench/gpu_check.sh, docs/gpu.md), a process each.

    python bench/gpu_check.py codecs --platform gpu --mib 256 --out codecs.json
    python bench/gpu_check.py collectives --platform gpu --out collectives.json
    python bench/gpu_check.py report --work DIR --out bench/results/gpu_check.json

`codecs`: encode/decode GB/s (1e9 bytes/s of uncompressed input) of zfp:8, zfp:16, zfp:8:d3, q8 and
mpc on --mib MiB of a float32 and a bfloat16 random walk, beside the device's copy bandwidth
measured in the same run (a jitted device-to-device copy of the same array, GB/s of bytes copied:
each is read once and written once); every payload and decoded array compared with the CPU
codecs' on the same input. `collectives`: jitted compressed psum / all_gather against jax.lax on
one device (a one-device shard_map whose four "ranks" are a named vmap axis, so the codecs and the
algorithm run whole) and, with several devices, over all of them; the same programs on the CPU
must give the same bits. `report`: the shell script's per-stage records (exit status, seconds,
output tail) and the stages' JSON into one file; it needs no jax.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # jax is imported by the stages that use it: `report` runs without it
    import jax

__all__ = ["CODECS", "COLLECTIVE_CODECS", "STAGES", "codecs_stage", "collectives", "main", "report"]

CODECS = ("zfp:8", "zfp:16", "zfp:8:d3", "q8", "mpc")
DTYPES = ("float32", "bfloat16")
# GB/s of float32 input on an H200 that the CUDA kernels aim at (docs/gpu.md).
TARGETS = {"zfp:8": 1000.0, "q8": 2000.0}
TARGET_DEVICE = "H200"
COLLECTIVE_CODECS = ("zfp:8", "zfp:16", "zfp:8:d3", "q8", "q4", "mpc", "mpc:0.8")
STAGES = ("setup", "gpu_tests", "codecs", "collectives", "oracle_tests")
TAIL_CHARS = 4000


def _bits(a):
    import numpy as np

    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _same(a, b) -> bool:
    """Whether two arrays (or pytrees of arrays) hold the same shapes, dtypes and bits."""
    import jax
    import numpy as np

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(_bits(x), _bits(y))
        for x, y in zip(la, lb, strict=True)
    )


# --- codecs: throughput against the copy bandwidth, payloads against the CPU's ----------------


def random_walk(n: int, dtype, device) -> jax.Array:
    """A float32 random walk (smooth at the scale of a ZFP block) of n values, made on `device`."""
    import jax
    import jax.numpy as jnp

    make = jax.jit(lambda k: jnp.cumsum(jax.random.normal(k, (n,), jnp.float32)).astype(dtype))
    return make(jax.device_put(jax.random.key(0), device))


def compare_with_cpu(codec, x, cpu) -> dict:
    """The device's payload and decoded values against the CPU codecs' on the same input."""
    import jax

    def roundtrip(v):
        enc = codec.encode(v)
        return enc.payload, enc.ok, enc.nbytes, codec.decode(enc.payload, v.shape, v.dtype)

    fn = jax.jit(roundtrip)
    here, there = fn(x), fn(jax.device_put(x, cpu))
    return {
        "same_payload_as_cpu": _same(here[:3], there[:3]),
        "same_decode_as_cpu": _same(here[3], there[3]),
    }


def codecs_stage(args: argparse.Namespace) -> dict:
    import jax
    import jax.numpy as jnp
    from _common import gbps, time_codec, timings

    from jaxhc.codecs import parse

    device = jax.devices(args.platform)[0]
    cpu = jax.devices("cpu")[0]
    compare = device.platform != "cpu"
    calls = args.calls or (20 if compare else 1)
    out = {"device": device.device_kind, "platform": device.platform, "mib": args.mib}
    out.update(calls_per_sample=calls, repeats=args.repeats, records=[])
    for dtype in DTYPES:
        n = args.mib * 2**20 // jnp.dtype(dtype).itemsize
        x = random_walk(n, jnp.dtype(dtype), device)
        copy = jax.jit(lambda v: jnp.copy(v))
        t = timings(lambda: copy(x), args.repeats, calls=calls)  # noqa: B023 - called right here
        copy_gbps = gbps(x.nbytes, t["s"])
        out["records"].append(
            {"codec": "copy", "dtype": dtype, "bytes": x.nbytes, "gbps": copy_gbps}
        )
        print(f"{dtype} copy: {copy_gbps:.1f} GB/s", flush=True)
        for spec in CODECS:
            codec = parse(spec)
            t = time_codec(codec, x, args.repeats, calls=calls)
            rec = {"codec": spec, "dtype": dtype, "bytes": x.nbytes, "ratio": t["ratio"]}
            for op in ("encode", "decode"):
                rate = gbps(x.nbytes, t[op]["s"]) if t[op] else None
                rec[f"{op}_gbps"] = rate
                rec[f"{op}_of_copy"] = rate / copy_gbps if rate else None
            rec["timings"] = {op: t[op] for op in ("encode", "decode")}
            if spec in TARGETS and dtype == "float32":
                rec["target_gbps"] = TARGETS[spec]
                rec["meets_target"] = (
                    min(rec["encode_gbps"] or 0, rec["decode_gbps"] or 0) >= TARGETS[spec]
                    if TARGET_DEVICE in device.device_kind
                    else None
                )
            if compare:
                rec.update(compare_with_cpu(codec, x, cpu))
            out["records"].append(rec)
            print(
                f"{dtype} {spec}: encode {rec['encode_gbps'] or 0:.1f} GB/s, "
                f"decode {rec['decode_gbps'] or 0:.1f} GB/s, ratio {rec['ratio']:.2f}"
                + (f", same as CPU {rec['same_payload_as_cpu']}" if compare else ""),
                flush=True,
            )
    return out


# --- collectives: compressed psum / all_gather against jax.lax ---------------------------------


def _tolerance(x, spec: str, terms: int) -> float:
    """A loose bound on a lossy collective's error: a few steps of the codec at the data's range
    (zfp at rate R: 2^-(R-5) of it, tests/test_collectives.py; q8/q4: 1/Q of each block's
    absmax), times the terms summed."""
    import numpy as np

    scale = float(np.max(np.abs(np.asarray(x, np.float64)))) * terms
    if spec.startswith("zfp"):
        return scale * 2.0 ** -(float(spec.split(":")[1]) - 5)
    if spec.startswith("q"):
        return scale * 2.0 / ((1 << (int(spec[1]) - 1)) - 1)
    return 0.0  # lossless


def _pair(spec: str, axis: str):
    """(jaxhc's psum and all_gather, jax.lax's) over `axis`, as one function each."""
    from jax import lax

    import jaxhc

    def ours(x):
        return jaxhc.psum(x, axis, codec=spec), jaxhc.all_gather(x, axis, codec=spec)

    def ref(x):
        return lax.psum(x, axis), lax.all_gather(x, axis)

    return ours, ref


def _check(got, want, x, spec, ranks) -> dict:
    import numpy as np

    rec = {}
    for name, g, w, terms in zip(("psum", "all_gather"), got, want, (ranks, 1), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        err = float(np.max(np.abs(g - w))) if g.size else 0.0
        bound = _tolerance(x, spec, terms)
        rec[name] = {"max_abs_error": err, "bound": bound, "within_bound": err <= bound}
    return rec


def rank_data(ranks: int, n: int):
    """Per rank n float32 values of a smooth signal plus a little faster wiggle."""
    import numpy as np

    t = np.linspace(0, 6, ranks * n).reshape(ranks, n)
    return (np.sin(t) + 0.01 * np.cos(37 * t)).astype(np.float32)


def on_one_device(f, device, x):
    """`f` per row of x over a named vmap axis "x" inside a one-device shard_map, jitted: on one
    device the whole compressed algorithm (codecs, all_to_all, rank-order sums, all_gather)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    body = jax.vmap(f, axis_name="x")
    mesh = Mesh(np.array([device]), ("d",))
    # check_vma off: a vmap axis carries no shard_map "varying" type to check.
    sharded = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    return jax.jit(sharded)(jax.device_put(x, device))


def on_devices(f, devices, x):
    """`f` per rank over a mesh axis "x" of `devices` (x's row r on device r), jitted."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), ("x",))
    body = jax.shard_map(
        lambda a: jax.tree.map(lambda y: y[None], f(a[0])),
        mesh=mesh,
        in_specs=P("x"),
        out_specs=P("x"),
        check_vma=False,
    )
    return jax.jit(body)(jax.device_put(x, NamedSharding(mesh, P("x"))))


def collectives(devices: list, specs: list[str], n: int, ranks: int = 4) -> dict:
    """Per codec: the compressed psum and all_gather against jax.lax's on the first device (over
    `ranks` emulated ranks) and, with several devices, over all of them; the same programs on the
    CPU (where it has the devices) must give the same bits, and so must the emulated ranks and
    real devices when there are `ranks` of them."""
    import jax

    cpus = jax.devices("cpu")
    accel = devices[0].platform != "cpu"
    x1, xp = rank_data(ranks, n), rank_data(len(devices), n)
    out = {"one_device": {}, "all_devices": {}} if len(devices) > 1 else {"one_device": {}}
    for spec in specs:
        ours, ref = _pair(spec, "x")
        got = on_one_device(ours, devices[0], x1)
        rec = _check(got, on_one_device(ref, devices[0], x1), x1, spec, ranks)
        if accel:
            rec["same_as_cpu"] = _same(got, on_one_device(ours, cpus[0], x1))
        out["one_device"][spec] = rec
        if len(devices) == 1:
            continue
        many = on_devices(ours, devices, xp)
        rec = _check(many, on_devices(ref, devices, xp), xp, spec, len(devices))
        if accel and len(cpus) >= len(devices):
            rec["same_as_cpu"] = _same(many, on_devices(ours, cpus[: len(devices)], xp))
        if len(devices) == ranks:
            rec["same_as_one_device"] = _same(many, got)
        out["all_devices"][spec] = rec
    return out


def collectives_stage(args: argparse.Namespace) -> dict:
    import jax

    devices = jax.devices(args.platform)
    out = {"platform": devices[0].platform, "devices": len(devices), "values_per_rank": args.n}
    out["codecs"] = args.codecs.split(",")
    out.update(collectives(devices, out["codecs"], args.n))
    for where in ("one_device", "all_devices"):
        for spec, rec in out.get(where, {}).items():
            print(f"{where} {spec}: {json.dumps(rec)}", flush=True)
    return out


# --- report ----------------------------------------------------------------------------------


def _read_meta(path: str) -> dict:
    meta = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            meta[key] = value
    return meta


def _junit(path: str) -> dict | None:
    """Counts of a pytest JUnit report (tests, failures, errors, skipped) and the failed ids."""
    if not os.path.exists(path):
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors")}
    counts["skipped"] = sum(int(s.get("skipped", 0)) for s in suites)
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    counts["failed_ids"] = failed
    return counts


def stage_record(work: str, name: str, gpu: bool = True) -> dict:
    """What the shell script recorded for one stage, with its results where it wrote some (`gpu`:
    a GPU run, whose tests must not all skip)."""
    meta_path = os.path.join(work, f"{name}.meta")
    if not os.path.exists(meta_path):
        return {"status": "not run"}
    meta = _read_meta(meta_path)
    rc = meta.get("rc", "")
    status = {"skipped": "skipped", "0": "ok", "124": "timeout", "137": "timeout"}.get(rc, "failed")
    rec = {"status": status, "exit": int(rc) if rc.lstrip("-").isdigit() else None}
    rec["seconds"] = int(meta.get("ms", 0)) / 1000
    rec["limit_s"] = int(meta.get("limit", 0))
    log = os.path.join(work, f"{name}.log")
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            text = f.read()
        rec["tail"] = text[-TAIL_CHARS:]
        m = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
        if m:
            rec["collected"] = int(m.group(1))
    tests = _junit(os.path.join(work, f"{name}.xml"))
    if tests is not None:
        rec["tests"] = tests
        if gpu and status == "ok" and tests["tests"] and tests["skipped"] == tests["tests"]:
            rec["status"] = "failed"  # a GPU run whose GPU tests all skipped tested nothing
            rec["note"] = "every test skipped: jax saw no GPU"
    result = os.path.join(work, f"{name}.json")
    if os.path.exists(result):
        with open(result) as f:
            rec["result"] = json.load(f)
    return rec


def report(args: argparse.Namespace) -> dict:
    stages = {name: stage_record(args.work, name, args.mode == "gpu") for name in STAGES}
    return {
        "mode": args.mode,
        "seconds": args.seconds,
        "ok": all(s["status"] == "ok" for s in stages.values()),
        "stages": stages,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="stage", required=True)
    c = sub.add_parser("codecs", help="codec GB/s against the copy bandwidth; payloads vs the CPU")
    c.add_argument("--platform", default="gpu", help="jax platform (gpu, cpu)")
    c.add_argument("--mib", type=int, default=256, help="MiB per array (default 256)")
    c.add_argument("--repeats", type=int, default=5, help="timed samples (best kept)")
    c.add_argument("--calls", type=int, default=0, help="calls per sample (0: 20 on a GPU, else 1)")
    c.add_argument("--out", required=True)
    k = sub.add_parser("collectives", help="compressed psum / all_gather against jax.lax")
    k.add_argument("--platform", default="gpu", help="jax platform (gpu, cpu)")
    k.add_argument("--n", type=int, default=4099, help="values per rank")
    k.add_argument("--codecs", default=",".join(COLLECTIVE_CODECS), help="comma-separated specs")
    k.add_argument("--out", required=True)
    r = sub.add_parser("report", help="the stages' records and results into one JSON")
    r.add_argument("--work", required=True, help="the folder of the stages' .meta/.log/.json")
    r.add_argument("--out", required=True)
    r.add_argument("--mode", default="gpu", choices=("gpu", "dry-run"))
    r.add_argument("--seconds", type=float, default=None, help="the whole check's wall time")
    args = ap.parse_args(argv)

    if args.stage == "report":
        doc = report(args)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        bad = [n for n, s in doc["stages"].items() if s["status"] != "ok"]
        print(
            f"wrote {args.out}: " + ("every stage ok" if not bad else f"not ok: {', '.join(bad)}")
        )
        return 0
    if args.stage == "collectives":
        from jaxhc.launch import set_cpu_device_count

        # The CPU runs of the same programs on as many devices (on the CPU platform: 4 to keep
        # the dry run short).
        set_cpu_device_count(4 if args.platform == "cpu" else 8)
    from _common import write_json

    result = codecs_stage(args) if args.stage == "codecs" else collectives_stage(args)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
