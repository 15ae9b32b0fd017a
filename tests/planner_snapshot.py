"""The planner's predictions over the shipped presets and clusters, as `jaxhc plan` makes them:
what tests/test_plan_snapshot.py compares against tests/planner_snapshot.json, so that a refactor
that should not change a prediction is seen not to.

Each case is one `jaxhc plan` call (`jaxhc.plan.planfile.plans`, what the command ranks): a model
preset (GPT-2 and LLaMA), a cluster file of configs/clusters/, and the codecs the cluster prices,
a policy of configs/policy/ (``--compression``), mixed precision, the MPI transport or every model
parallel size. A case records how many plans there are and fit, the first fitting plans in full
(the plan, memory per device by part, bytes and seconds of communication, step time, whether
`jaxhc train` takes it), the plan ``--write`` picks, and a SHA-256 of every ranked row in full.

When a change of the predictions is intended, write the file again and commit it with the change:

    .venv/bin/python -m tests.planner_snapshot --write

(``--check`` compares and prints the differing cases, as the test does.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = Path(__file__).resolve().parent / "planner_snapshot.json"
REGENERATE = ".venv/bin/python -m tests.planner_snapshot --write"
BATCH = 1024  # sequences per step: AMSP's setting, one per GPU of the 1024-GPU clusters
TOP = 2  # fitting plans recorded in full per case
HYBRID = ("zhybrid", "qhybrid")  # the policies priced on every cluster (all of them on a100-1024)


def _clusters() -> list[Path]:
    return sorted((ROOT / "configs" / "clusters").glob("*.yaml"))


def _policies(names=None) -> list[Path]:
    """The policy files of configs/policy/ (those of `names` when given)."""
    every = sorted((ROOT / "configs" / "policy").glob("*.yaml"))
    return [p for p in every if names is None or p.stem in names]


def cases() -> list[dict]:
    """Every case: `plans`'s arguments by name, the cluster and policy as their files' paths
    relative to the repository root. Every model preset, cluster and policy is in one case or
    more. A search evaluates ten times the plans it keeps when every tensor and pipe size is
    open, so the cases with codecs or policies fix them (``--mesh``; the policies' tensor and pipe
    codecs in one case: the clusters price no mpc, which qhybrid and mzhybrid give those axes),
    and the whole takes seconds."""
    out = []
    gpt2 = ["gpt2-small", "gpt2-large", "gpt2-xl"]
    for i, cluster in enumerate(_clusters()):
        cl = str(cluster.relative_to(ROOT))
        codecs = ",".join(["none", *_priced_codecs(cluster)])
        out.append({"model": "llama-65b", "cluster": cl})  # every tensor x pipe size
        for model in ("llama-7b", "llama-30b"):  # AMSP's setting: bf16 mixed, 4096 tokens
            out.append({"model": model, "cluster": cl, "precision": "mixed", "seq": 4096})
        pipe = {"codecs": codecs, "mesh": "tensor=1,pipe=4"}
        out.append({"model": gpt2[i % len(gpt2)], "cluster": cl, **pipe})
        mpi = {"codecs": "none,zfp:8", "transport": "mpi", "mesh": "tensor=1,pipe=1"}
        out.append({"model": "llama-13b", "cluster": cl, **mpi})
        policies = _policies() if cluster.name == "a100-1024.yaml" else _policies(HYBRID)
        for policy in policies:
            pol = {"compression": str(policy.relative_to(ROOT)), "mesh": "tensor=1,pipe=1"}
            out.append({"model": "gpt2-medium", "cluster": cl, **pol})
    zhybrid = {"compression": "configs/policy/zhybrid.yaml", "mesh": "tensor=2,pipe=2"}
    out.append({"model": "gpt2-medium", "cluster": "configs/clusters/a100-1024.yaml", **zhybrid})
    return out


def _priced_codecs(cluster: Path) -> list[str]:
    from jaxhc.plan import cluster as clusters

    return sorted(clusters.load(str(cluster)).to_dict().get("codecs", {}))


def name(case: dict) -> str:
    """A case as the `jaxhc plan` options that make it."""
    opts = [f"--{k.replace('_', '-')} {v}" for k, v in case.items()]
    return " ".join(opts)


def _row(c) -> dict:
    """A ranked plan in full: the plan, what it holds per device, moves and takes."""
    from jaxhc.plan.search import describe

    lay, m = c.layout, c.memory
    plan = (
        f"{describe(lay)}; microbatches {lay.microbatches}, {lay.precision}, gather "
        f"{lay.gather}, {lay.transport}"
    )
    return {
        "plan": plan,
        "memory": None
        if m is None
        else [m.params, m.grads, m.optim, m.activations, m.temporaries, m.total],
        "comm_bytes": c.comm_bytes,
        "comm_seconds": c.comm_seconds,
        "step_seconds": c.step_seconds,
        "rejected": c.rejected,
        "trainable": c.trainable,
        "family": c.family,
    }


def predict(case: dict) -> dict:
    """The planner's predictions of one case (what the expectation file holds for it), its paths
    relative to the working directory (`snapshot` runs in the repository root, as `jaxhc plan`
    names a policy file in its plans the way its command line does)."""
    from jaxhc.plan import cluster as clusters
    from jaxhc.plan import load_shape, planfile
    from jaxhc.train.config import parse_mesh

    shape = load_shape(case["model"])
    cluster = clusters.load(case["cluster"])
    seq = case.get("seq") or (shape.gpt.block_size if shape.gpt is not None else 2048)
    compression = case.get("compression")
    try:
        rows = planfile.plans(
            shape,
            cluster,
            BATCH,
            seq,
            codecs=tuple(case.get("codecs", "none").split(",")),
            compression=compression,
            precision=case.get("precision", "float32"),
            mesh=parse_mesh(case["mesh"]) if "mesh" in case else None,
            model_parallel=case.get("model_parallel", "min"),
            transport=case.get("transport", "xla"),
        )
    except ValueError as e:  # what `jaxhc plan` says in one line (a codec the cluster lacks)
        return {"error": str(e)}
    full = [_row(c) for c in rows]
    fits = [r for r in full if not r["rejected"]]
    best = planfile.best(rows)
    return {
        "plans": len(full),
        "fit": len(fits),
        "top": fits[:TOP],
        "write": None if best is None else _row(best)["plan"],
        "sha256": hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest(),
    }


def snapshot() -> dict:
    """Every case's predictions, made in the repository root."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        return {name(case): predict(case) for case in cases()}
    finally:
        os.chdir(here)


def differences(expected: dict, got: dict) -> list[str]:
    """One line per case that differs (missing, new, or which of its predictions changed), and
    the first recorded plan that changed."""
    out = []
    for key in sorted(set(expected) | set(got)):
        if key not in got:
            out.append(f"{key}: no longer a case")
        elif key not in expected:
            out.append(f"{key}: a new case")
        elif expected[key] != got[key]:
            was, now = expected[key], got[key]
            fields = [f for f in sorted(set(was) | set(now)) if was.get(f) != now.get(f)]
            if fields == ["sha256"]:
                fields = ["sha256 (a plan below the recorded ones)"]
            out.append(f"{key}: {', '.join(fields)} changed")
            if "top" in fields:
                a, b = was.get("top", []), now.get("top", [])
                i = next(
                    (i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b))
                )
                gone = "(none)"
                out.append(f"  plan {i + 1} was {a[i] if i < len(a) else gone}")
                out.append(f"  plan {i + 1} now {b[i] if i < len(b) else gone}")
    return out


def dumps(snap: dict) -> str:
    """The expectation file's text: a case a block, a recorded plan a line (diffs stay short)."""
    out = []
    for key, case in sorted(snap.items()):
        fields = [
            f"  {json.dumps(k)}: "
            + (
                "[\n" + ",\n".join(f"   {json.dumps(r, sort_keys=True)}" for r in v) + "\n  ]"
                if k == "top" and v
                else json.dumps(v)
            )
            for k, v in sorted(case.items())
        ]
        out.append(f" {json.dumps(key)}: {{\n" + ",\n".join(fields) + "\n }")
    return "{\n" + ",\n".join(out) + "\n}\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {EXPECTED.name}")
    mode.add_argument("--check", action="store_true", help=f"compare with {EXPECTED.name}")
    args = p.parse_args(argv)
    got = snapshot()
    if args.write:
        EXPECTED.write_text(dumps(got))
        print(f"wrote {EXPECTED.relative_to(ROOT)}: {len(got)} cases")
        return 0
    diff = differences(json.loads(EXPECTED.read_text()), got)
    print("\n".join(diff) or f"{len(got)} cases as in {EXPECTED.relative_to(ROOT)}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
