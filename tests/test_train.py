"""The training CLI: every shipped config runs, resume is bit-exact, reports, one-line errors."""

from __future__ import annotations

import glob
import json
import math
import os

import jax
import numpy as np
import pytest
import yaml
from _tiers import quick

from jaxhc import cli
from jaxhc.codecs import Mpc, Quant, Zfp
from jaxhc.parallel import init_state, make_mesh, make_train_step
from jaxhc.parallel.state import Plan
from jaxhc.policy import KINDS, Policy
from jaxhc.train.checkpoint import Checkpoints
from jaxhc.train.config import load
from jaxhc.train.report import summarize

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "configs")
QUICK_POLICIES = ("/mzhybrid.yaml", "/q4_ef.yaml")
# A shrunken model: as many layers as pipeline stages, tiny widths, a few steps.
TINY = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=4",
    "model.block_size=16",
    "train.batch_size=8",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.ckpt_every=2",
    "mesh.microbatches=2",
]


def train(out, *args) -> int:
    """`jaxhc train` of the tiny model into `out`; the exit status."""
    return cli.main(["train", "--out", str(out), "--no-progress", *TINY, *args])


def every_message(policy: str, tmp_path) -> str:
    """A copy of policy `policy` (preset name or YAML path) with ``min_bytes: 0``: the shipped
    presets skip messages under 64 KiB, which would leave every message of the tiny model raw."""
    path = policy if policy.endswith(".yaml") else os.path.join(CONFIGS, "policy", policy + ".yaml")
    data = yaml.safe_load(open(path))
    copy = tmp_path / f"{data['name']}-every-message.yaml"
    copy.write_text(yaml.safe_dump({**data, "min_bytes": 0}))
    return str(copy)


def _bits(codec) -> tuple[float, float]:
    """(fewest, most) payload bits per value of a fixed-size codec's messages: ZFP its rate (plus
    the rows' padding and the 4-byte agreement flags), q8/q4 its codes (plus a float32 scale a
    block and padding)."""
    if isinstance(codec, Zfp):
        return codec.rate, codec.rate * 1.02
    return codec.bits, codec.bits_per_value * 1.05


def assert_compressed(record: dict, policy: str, axes) -> None:
    """Each of `axes` moved what its codec promises: ZFP its fixed rate and MPC within its budget
    with no fallback, MPC less than raw, the identity codec and plain collectives raw bytes (an
    axis whose kinds have fixed-size codecs of their own: between the fewest and most bits)."""
    policy = Policy.load(policy)
    for axis in axes:
        codec = policy.codec_for(axis)
        raw, wire = record["raw_bytes"][axis], record["wire_bytes"][axis]
        fell = record["fallbacks"][axis]
        where = f"{policy.name} {axis}: raw {raw} wire {wire} fallbacks {fell}"
        kinds = {policy.codec_for(axis, kind) for kind in KINDS}
        if len(kinds) > 1 and all(isinstance(c, (Zfp, Quant)) for c in kinds):
            low, high = min(_bits(c)[0] for c in kinds), max(_bits(c)[1] for c in kinds)
            assert raw * low / 32 < wire < raw * high / 32, where
            assert fell == 0, where
            continue
        if isinstance(codec, Zfp):
            # fixed rate, plus the rows' padding and the 4-byte agreement flags
            assert raw * codec.rate / 32 < wire < raw * codec.rate / 32 * 1.02, where
            assert fell == 0, where
        elif isinstance(codec, Quant):  # fixed size: codes, a float32 scale a block, padding
            bits = codec.bits_per_value
            assert raw * codec.bits / 32 < wire < raw * bits / 32 * 1.05, where
            assert fell == 0, where
        elif isinstance(codec, Mpc):  # the static budget moves; some messages may not fit it
            assert wire < raw, where
            assert fell == 0 or wire > codec.budget * raw, where
        else:
            assert wire == raw and fell == 0, where


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def experiments():
    paths = glob.glob(os.path.join(CONFIGS, "experiments", "*.yaml"))
    return sorted(p for p in paths if "base" not in (yaml.safe_load(open(p)) or {}))


# The quick suite trains the default experiment; every one runs under `slow` (CI time).
@pytest.mark.parametrize(
    "path",
    quick(experiments(), [p for p in experiments() if p.endswith("/default.yaml")]),
    ids=os.path.basename,
)
def test_every_shipped_experiment_runs_one_step_shrunk(path, tmp_path):
    out = tmp_path / "run"
    experiment = yaml.safe_load(open(path))
    mesh = experiment.get("mesh", {})
    policy = every_message(experiment.get("compression", "zhybrid"), tmp_path)
    batch = max(8, 2 * mesh.get("data", 1))  # TINY's two microbatches on every data rank
    args = ["--config", path, "--steps", "1", "--compression", policy, f"train.batch_size={batch}"]
    assert train(out, *args) == 0
    record = json.loads(open(out / "metrics.jsonl").read())
    assert record["step"] == 0 and record["loss"] > 0 and record["val_loss"] > 0
    moving = {axis for axis in ("data", "tensor", "pipe") if mesh.get(axis, 1) > 1}
    assert set(record["wire_bytes"]) >= moving
    assert_compressed(record, policy, moving)
    assert json.load(open(out / "config.json"))["model"]["n_layer"] == 2


SHIPPED_POLICIES = sorted(glob.glob(os.path.join(CONFIGS, "policy", "*.yaml")))


@pytest.mark.parametrize("policy", SHIPPED_POLICIES, ids=os.path.basename)
def test_every_shipped_policy_builds_its_train_step(policy, tmp_path):
    """Every shipped policy, compressing every message, loads and its train step traces and
    lowers on the tiny 2 x 2 x 2 mesh (what `jaxhc train` does before compiling)."""
    cfg = load(None, TINY)
    mesh = make_mesh(cfg.mesh, jax.devices()[: cfg.mesh.size])
    policy = Policy.load(every_message(policy, tmp_path))
    step = make_train_step(cfg.model, cfg.mesh, cfg.optim, mesh, policy)
    state = init_state(cfg.model, cfg.mesh, cfg.optim, mesh, 0, policy=policy)
    tokens = jax.ShapeDtypeStruct((cfg.train.batch_size, cfg.model.block_size + 1), np.int32)
    hlo = step.lower(state, tokens).as_text()
    codecs = {policy.codec_for(a, k) for a in ("data", "tensor", "pipe") for k in KINDS}
    assert ("jaxhc_" in hlo) == any(c is not None and c.spec != "none" for c in codecs), hlo[:200]


# One step of each shipped policy runs under `slow` (`make test-all`); the quick suite runs one
# of each codec family: zfp with mpc, q8 with zfp, q4:h with error feedback.
@pytest.mark.parametrize(
    "policy",
    quick(SHIPPED_POLICIES, [p for p in SHIPPED_POLICIES if p.endswith(QUICK_POLICIES)]),
    ids=os.path.basename,
)
def test_every_shipped_policy_compresses_one_step(policy, tmp_path):
    out = tmp_path / "run"
    policy = every_message(policy, tmp_path)
    assert train(out, "--compression", policy, "--steps", "1") == 0
    record = json.loads(open(out / "metrics.jsonl").read())
    assert record["loss"] > 0
    assert_compressed(record, policy, ("data", "tensor", "pipe"))


def test_a_budget_too_small_falls_back_on_every_axis(tmp_path):
    """MPC at half the raw size cannot hold most float32 training traffic losslessly: messages
    fall back to raw on every axis and say so, and the wire bytes count what moved raw."""
    path = tmp_path / "tight.yaml"
    axes = ", ".join(f"{a}: mpc:0.5" for a in ("data", "tensor", "pipe"))
    path.write_text(f"name: tight\nmin_bytes: 0\naxes: {{{axes}}}\n")
    assert train(tmp_path / "run", "--compression", str(path), "--steps", "1") == 0
    record = json.loads(open(tmp_path / "run" / "metrics.jsonl").read())
    for axis in ("data", "tensor", "pipe"):
        assert record["fallbacks"][axis] > 0, record
        assert record["wire_bytes"][axis] > 0.5 * record["raw_bytes"][axis], record


EF_POLICY = """\
name: every-message-ef
min_bytes: 0
axes:
  data: {codec: zfp, rate: 8, error_feedback: true}
  tensor: {codec: mpc, budget: 0.95}
  pipe: {codec: zfp, rate: 16}
"""


@pytest.mark.slow  # CI time: the quick suite resumes zfp residuals (tests/test_train_mpi.py)
def test_resume_continues_bit_exactly(tmp_path):
    """Every message compressed, gradients with error feedback: the residuals are in the checkpoint
    (non-zero, one padded vector per device) and resuming from them continues bit for bit."""
    policy = tmp_path / "ef.yaml"
    policy.write_text(EF_POLICY)
    common = ["--compression", str(policy), "optim.total_steps=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert train(full, "train.steps=4", *common) == 0
    assert train(part, "train.steps=2", *common) == 0
    assert train(part, "train.steps=4", "--resume", *common) == 0
    assert losses(part) == losses(full)  # bit-identical floats, steps 0..3
    cfg = load(os.path.join(CONFIGS, "experiments", "default.yaml"), TINY + common[2:])
    plan = Plan(cfg.model, cfg.mesh, cfg.optim, str(policy))
    residual = Checkpoints(str(part / "checkpoints")).read_global(plan, 4).opt_state["residual"]
    assert residual.shape[:2] == (2, 2) and np.isfinite(residual).all() and residual.any()


def _policy(data: str, extra: str = "") -> str:
    return f"name: resume-check\nmin_bytes: 0\n{extra}axes:\n  data: {{{data}}}\n"


Q4_KEEP_OWN = "codec: q4, rotate: true, error_feedback: true, keep_own: true, param: q8"
BLOCK_MIXING = {  # codecs whose coding error spreads over a block, padding included
    "q4h-ef-keep_own": _policy(Q4_KEEP_OWN),
    "q4h-ef": _policy("codec: q4, rotate: true, error_feedback: true, param: q8"),
    "q8h-ef": _policy("codec: q8, rotate: true, error_feedback: true"),
    "q4h-ef-keep_own-param_delta": _policy(
        "codec: q4, rotate: true, error_feedback: true, keep_own: true, param_delta: true"
    ),
    "q4h-ef-keep_own-warmup": _policy(Q4_KEEP_OWN, "warmup_steps: 1\nwarmup_codec: q8\n"),
}


NO_TENSOR = "--mesh", "data=4,tensor=1,pipe=2"


@pytest.mark.slow  # CI time: ~90 s each; the quick suite resumes zfp residuals (test_train_mpi.py)
@pytest.mark.parametrize(
    "name, mesh",
    [*[(n, NO_TENSOR) for n in BLOCK_MIXING], ("q4h-ef-keep_own", ())],
    ids=lambda x: "tensor1" if x == NO_TENSOR else ("tensor2" if x == () else None),
)
def test_resume_is_bit_exact_with_block_mixing_codecs(name, mesh, tmp_path):
    """Rotated q4/q8 decode non-zero values into the flat vectors' padding (a parameter's last
    row, which holds fewer than 64 values in the tiny model): resumed at step 1 and again at
    step 2, the losses and every leaf of the final state are those of the uninterrupted run. Under
    "tensor" = 2 too: the tensor ranks' copies of the parameters it does not split stay
    identical (a checkpoint keeps tensor rank 0's)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(BLOCK_MIXING[name])
    common = ["--compression", str(policy), *mesh, "optim.total_steps=3", "train.ckpt_every=1"]
    full = tmp_path / "full"
    assert train(full, "train.steps=3", *common) == 0
    over = [f"mesh.{kv}" for kv in mesh[1].split(",")] if mesh else []
    cfg = load(os.path.join(CONFIGS, "experiments", "default.yaml"), TINY + over + common[-2:])
    plan = Plan(cfg.model, cfg.mesh, cfg.optim, str(policy))
    want = jax.tree.leaves(Checkpoints(str(full / "checkpoints")).read_global(plan, 3))
    part = tmp_path / "part"  # stopped after step 1, resumed; stopped after step 2, resumed
    assert train(part, "train.steps=1", *common) == 0
    for steps in (2, 3):
        assert train(part, f"train.steps={steps}", "--resume", *common) == 0
    assert losses(part) == losses(full)  # bit-identical floats, steps 0..2
    got = jax.tree.leaves(Checkpoints(str(part / "checkpoints")).read_global(plan, 3))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.slow  # CI time: the quick suite writes a report in the sweep test below
def test_report_writes_table_and_plots(tmp_path):
    """Both runs sample their gradients' fidelity every step (train.fidelity_every=1): the records
    and the report's table carry it (zfp8 on every message: a small error; none: exact), with the
    loss gaps to the none run."""
    runs = []
    for name, policy in (("none", "none"), ("zfp8", every_message("zfp8", tmp_path))):
        runs.append(str(tmp_path / name))
        assert (
            train(runs[-1], "--compression", policy, "--steps", "2", "train.fidelity_every=1") == 0
        )
    records = [json.loads(line) for line in open(tmp_path / "zfp8" / "metrics.jsonl")]
    assert all(0 < r["grad_rel_err"] < 1 and 0.5 < r["grad_cos"] < 1 for r in records), records
    assert cli.main(["report", *runs, "--out", str(tmp_path / "report")]) == 0
    text = open(tmp_path / "report" / "report.md").read()
    header, _, none, zfp8 = (
        [cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()[2:6]
    )
    none, zfp8 = dict(zip(header, none, strict=True)), dict(zip(header, zfp8, strict=True))
    assert (none["run"], none["policy"]) == ("none", "none")
    assert zfp8["run"] == "zfp8" and zfp8["policy"].endswith("zfp8-every-message.yaml")
    assert float(zfp8["grad_rel_err"]) == pytest.approx(
        np.mean([r["grad_rel_err"] for r in records]), rel=1e-3
    )
    assert float(none["grad_rel_err"]) == 0 and float(none["final_val_loss_gap_pct"]) == 0
    val, none_val = float(zfp8["final_val_loss"]), float(none["final_val_loss"])
    assert float(zfp8["final_val_loss_gap_pct"]) == pytest.approx(
        100 * (val - none_val) / none_val, abs=0.05
    )
    for png in ("loss_vs_step.png", "loss_vs_wire.png", "fidelity.png"):
        assert os.path.getsize(tmp_path / "report" / png) > 1000


def test_report_gaps_need_a_none_run_of_the_same_length():
    def run(policy, losses):
        steps = [{"step": i, "loss": loss} for i, loss in enumerate(losses)]
        return {"name": policy, "config": {"compression": policy}, "steps": steps}

    base = summarize(run("none", [2.0, 1.0]), tail=1)
    assert summarize(run("zfp8", [2.0, 1.1]), tail=1, baseline=base)[
        "final_loss_gap_pct"
    ] == pytest.approx(10.0)
    assert math.isnan(summarize(run("zfp16", [2.0]), tail=1, baseline=base)["final_loss_gap_pct"])
    assert math.isnan(summarize(run("zfp8", [2.0, 1.1]), tail=1)["final_loss_gap_pct"])


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--mesh", "data=2,tensor=2,pipe=1"], "does not match the 8 devices"),
        (["model.n_head=3", "model.n_embd=48"], "model.n_head=3 is not divisible by mesh tensor=2"),
        (["model.n_layer=3"], "model.n_layer=3 is not divisible by mesh pipe=2"),
        (["train.batch_size=6"], "train.batch_size=6 is not divisible by mesh data x microbatches"),
        (["--compression", "zhybird"], "unknown policy 'zhybird'"),
        (["--compression", "nope.yaml"], "policy file 'nope.yaml' does not exist"),
        (["model.n_layr=2"], "unknown config key 'model.n_layr'"),
        (["optim.lr=fast"], "optim.lr='fast' must be a number"),
        (["--mesh", "data=two"], "data='two' is not an integer"),
        (["--config", "missing.yaml"], "config file 'missing.yaml' does not exist"),
        (["--compression", "PIPE_EF"], "axes.pipe.error_feedback is not supported by the trainer"),
    ],
)
def test_bad_input_is_one_line_error_naming_the_key(args, culprit, tmp_path, capsys):
    if "PIPE_EF" in args:
        path = tmp_path / "pipe_ef.yaml"
        path.write_text("axes:\n  pipe: {codec: zfp, rate: 16, error_feedback: true}\n")
        args = [str(path) if a == "PIPE_EF" else a for a in args]
    assert train(tmp_path / "r", *args) == 2
    err = capsys.readouterr().err.strip()
    assert culprit in err and len(err.splitlines()) == 1, err


def test_refuses_to_overwrite_a_run(tmp_path, capsys):
    assert train(tmp_path / "r", "--steps", "1") == 0
    assert train(tmp_path / "r", "--steps", "1") == 2
    assert "already holds a run" in capsys.readouterr().err


def test_default_yaml_spells_out_the_built_in_defaults():
    from jaxhc.train.config import load

    assert load(os.path.join(CONFIGS, "experiments", "default.yaml")) == load(None)


def test_sweep_runs_the_chosen_policies_and_reports(tmp_path, capsys):
    """`jaxhc sweep` trains its policies into one folder each and writes their report;
    `--policies` runs a subset, and a policy the sweep does not list is a one-line error."""
    sweep = tmp_path / "sweep.yaml"
    base = os.path.abspath(os.path.join(CONFIGS, "experiments", "default.yaml"))
    sweep.write_text(yaml.safe_dump({"base": base, "policies": ["none", "mpc"], "overrides": TINY}))
    out = tmp_path / "runs"
    args = ["sweep", str(sweep), "--out", str(out), "--no-progress", "train.steps=2"]
    assert cli.main([*args, "--policies", "mpc"]) == 0
    assert sorted(os.listdir(out)) == ["mpc", "report"]
    assert os.path.exists(out / "report" / "report.md") and _val_losses(out / "mpc")
    capsys.readouterr()
    assert cli.main([*args, "--policies", "mpc,zhybrid"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxhc sweep: error: --policies 'mpc,zhybrid': zhybrid is not among")
    assert len(err.splitlines()) == 1


def _val_losses(run) -> list[float]:
    with open(run / "metrics.jsonl") as f:
        return [r["val_loss"] for r in map(json.loads, f) if "val_loss" in r]
