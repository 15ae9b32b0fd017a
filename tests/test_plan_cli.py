"""`jaxhc plan`, `jaxhc profile` and `jaxhc train --plan`: output, files, one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from jaxhc import cli
from jaxhc.plan import cluster as clusters
from jaxhc.plan.profile import GROUP_OPS
from tests.test_cli import ROOT, jaxhc_train
from tests.test_train import TINY

A100 = str(ROOT / "configs" / "clusters" / "a100-1024.yaml")


def test_plan_prints_ranked_plans_rejections_and_families(capsys):
    argv = [
        "plan",
        "--model",
        "llama-65b",
        "--cluster",
        A100,
        "--batch",
        "1024",
        "--precision",
        "mixed",
        "--codecs",
        "none,zfp:8",
        "--mesh",
        "tensor=1,pipe=1",
        "--top",
        "5",
        "--rejected",
        "3",
        "--compare",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("llama-65b (65.286 B parameters) on a100-1024: 128 x 8 devices")
    assert "predicted" in out[0]
    assert out[1].startswith("| # | tensor | pipe | data | s_p | s_g | s_os |")
    rows = [x for x in out[3:8]]
    assert all(x.startswith("| ") for x in rows)
    times = [float(x.split("|")[18]) for x in rows]
    assert times == sorted(times)  # as printed (3 digits), then no recomputation, less memory
    rejected = [x for x in out if x.startswith("rejected: ")]
    assert len(rejected) == 3 and all("out of memory" in x for x in rejected)
    assert "more rejected (--rejected N shows more)" in out[out.index(rejected[-1]) + 1]
    fams = out[out.index("best of each family (raw traffic):") + 3 :]
    assert {x.split("|")[1].strip() for x in fams[:3]} == {"AMSP", "MiCS", "ZeRO-3"}
    fam_times = [float(x.split("|")[18]) for x in fams[:3]]
    assert fam_times == sorted(fam_times)
    assert fams[3:] == ["DDP: no plan fits", "ZeRO-1: no plan fits", "ZeRO-2: no plan fits"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-8b"], "--model 'llama-8b': use a preset"),
        (["--cluster", "nope.yaml"], "--cluster 'nope.yaml' does not exist"),
        (["--batch", "0"], "--batch 0 must be > 0"),
        (["--codecs", "zfp:1"], "bad codec spec 'zfp:1'"),
        (["--codecs", "q4"], "no speed for codec 'q4'"),
        (["--mesh", "data=8"], "--mesh: data follows from the cluster's devices"),
        (["--codecs", "zfp:8", "--compression", "zfp8"], "give --codecs or --compression"),
    ],
)
def test_plan_bad_input_is_one_line(capsys, args, message):
    base = {"--model": "gpt2-small", "--cluster": A100, "--batch": "64"}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    argv = ["plan", *[x for kv in base.items() for x in kv]]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.slow  # CI time: the quick suite profiles the codecs below
def test_profile_writes_a_cluster_the_planner_reads(tmp_path, capsys):
    out = tmp_path / "local.yaml"
    argv = [
        "profile",
        "--out",
        str(out),
        "--mib",
        "0.25",
        "--repeats",
        "1",
        "--codecs",
        "zfp:8,q8",
        "--links",
    ]
    assert cli.main(argv) == 0
    c = clusters.load(str(out))
    assert c.nodes == 1 and c.devices_per_node == 8
    assert set(c.codecs) == {"zfp:8", "q8"}
    assert all(s.encode > 0 and s.decode > 0 for s in c.codecs.values())
    assert c.intra.bandwidth > 0 and "links measured" in c.source and "load average" in c.source
    # links.collectives: every op over groups of 2, 4 and 8 of the 8 devices
    assert set(c.collectives) == {(op, k) for op in GROUP_OPS for k in (2, 4, 8)}
    assert all(x.bandwidth > 0 and x.latency >= 0 for x in c.collectives.values())
    capsys.readouterr()
    assert (
        cli.main(
            [
                "plan",
                "--model",
                "gpt2-small",
                "--cluster",
                str(out),
                "--batch",
                "8",
                "--codecs",
                "none,zfp:8",
            ]
        )
        == 0
    )
    assert cli.main(["profile", "--codecs", "none"]) == 2
    assert "'none' has no speed" in capsys.readouterr().err


def test_profile_is_quick_by_default():
    """The default run (codecs only) in a fresh process, well under 30 s of its own work."""
    cmd = [sys.executable, "-m", "jaxhc.cli", "profile"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    data = yaml.safe_load(run.stdout)
    assert clusters.from_dict(data).codecs.keys() == {"zfp:8", "zfp:16", "q8", "mpc"}


def _mesh_of(run) -> dict:
    return json.loads((run / "config.json").read_text())["mesh"]


def test_train_with_a_written_plan(tmp_path, capsys):
    local = tmp_path / "local.yaml"
    clusters.local(8, 2.0).dump(str(local))
    plan = tmp_path / "plan.yaml"
    argv = [
        "plan",
        "--model",
        str(tmp_path / "m.yaml"),
        "--cluster",
        str(local),
        "--batch",
        "8",
        "--mesh",
        "tensor=2,pipe=1",
        "--write",
        str(plan),
    ]
    (tmp_path / "m.yaml").write_text(
        "model: {vocab_size: 256, block_size: 16, n_layer: 2, n_head: 4, n_embd: 32}\n"
    )
    assert cli.main(argv) == 0
    written = yaml.safe_load(plan.read_text())
    assert written["mesh"]["tensor"] == 2 and written["compression"] == "none"
    log = tmp_path / "log"
    assert jaxhc_train(tmp_path / "a", log, "--steps", "2", "--plan", str(plan), *TINY) == 0, (
        log.read_text()
    )
    mesh = _mesh_of(tmp_path / "a")
    want = written["mesh"]
    assert {k: mesh[k] for k in ("data", "tensor", "pipe")} == {
        k: want[k] for k in ("data", "tensor", "pipe")
    }
    assert mesh["shard"]["optim"] == want["shard"]["optim"]
    # --plan with --mesh, a missing file, a bad key: one line each
    assert jaxhc_train(tmp_path / "c", log, "--plan", "auto", "--mesh", "data=8", *TINY) == 2
    assert "--plan and --mesh both set the mesh" in log.read_text()
    plan.write_text("mesh: {data: 8}\nextra: 1\n")
    assert jaxhc_train(tmp_path / "c", log, "--plan", str(plan), *TINY) == 2
    assert "unknown plan key 'extra'" in log.read_text()


@pytest.mark.slow  # CI time: a second training subprocess; the quick suite trains a written plan
def test_train_with_plan_auto_trains_the_plan_it_prints(tmp_path):
    log = tmp_path / "log"
    assert jaxhc_train(tmp_path / "b", log, "--steps", "2", "--plan", "auto", *TINY) == 0, (
        log.read_text()
    )
    line = next(x for x in log.read_text().splitlines() if x.startswith("plan auto: "))
    t, p, d, s_p, s_g, s_os = map(
        int,
        re.match(
            r"plan auto: tensor (\d+) pipe (\d+) data (\d+) \(s_p, s_g, s_os\) = \((\d+), (\d+), "
            r"(\d+)\)",
            line,
        ).groups(),
    )
    mesh = _mesh_of(tmp_path / "b")
    assert s_p > 1  # sharded parameters: the best plan here, and jaxhc trains it
    assert (mesh["tensor"], mesh["pipe"], mesh["data"]) == (t, p, d)
    assert (mesh["shard"]["params"], mesh["shard"]["grads"], mesh["shard"]["optim"]) == (
        s_p,
        s_g,
        s_os,
    )


@pytest.mark.slow
def test_auto_keeps_parameters_whole_when_fidelity_is_sampled(tmp_path):
    """The sampled fidelity needs whole local gradients, which s_p > 1 never holds: auto picks the
    best plan with s_p = 1 then (without it, this model's best plan shards the parameters)."""
    log = tmp_path / "log"
    argv = ["--steps", "1", "--plan", "auto", *TINY]
    assert jaxhc_train(tmp_path / "a", log, *argv, "train.fidelity_every=1") == 0, log.read_text()
    line = next(x for x in log.read_text().splitlines() if x.startswith("plan auto: "))
    assert "(s_p, s_g, s_os) = (1, " in line
    assert _mesh_of(tmp_path / "a")["shard"]["params"] == 1


def test_a_written_plan_with_a_codec_is_a_policy_train_loads(tmp_path, capsys):
    """Two nodes of 4: the data level that crosses nodes gets the codec, the node level none;
    `train --plan` applies the file's mesh and policy to the run's config."""
    two = clusters.from_dict(
        {
            "name": "two",
            "nodes": 2,
            "devices_per_node": 4,
            "memory_gib": 1,
            "links": {
                "intra": {"gbit_s": 800, "latency_us": 1},
                "inter": {"gbit_s": 1, "latency_us": 50},
            },
            "codecs": {"zfp:8": {"encode_gb_s": 50, "decode_gb_s": 50}},
        }
    )
    cpath, plan = tmp_path / "two.yaml", tmp_path / "plan.yaml"
    two.dump(str(cpath))
    (tmp_path / "m.yaml").write_text(
        "model: {vocab_size: 256, block_size: 16, n_layer: 2, n_head: 4, n_embd: 64}\n"
    )
    argv = [
        "plan",
        "--model",
        str(tmp_path / "m.yaml"),
        "--cluster",
        str(cpath),
        "--batch",
        "8",
        "--codecs",
        "zfp:8",
        "--mesh",
        "tensor=1,pipe=1",
        "--write",
        str(plan),
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    written = yaml.safe_load(plan.read_text())
    mesh = written["mesh"]
    groups = mesh["shard"]["groups"]
    assert mesh["data"] == 8 and groups[-1] == 4  # nested at the node boundary
    assert written["compression"] == {"name": "plan", "min_bytes": 0, "axes": {"data.0": "zfp:8"}}
    from jaxhc.plan import planfile
    from jaxhc.train.config import load

    cfg = planfile.apply(load(None), planfile.Plan.load(str(plan)))
    assert (cfg.mesh.data, cfg.mesh.shard.groups) == (8, tuple(groups))
    pol = cfg.policy
    assert (
        pol.codec_for("data.0", "grad").spec == "zfp:8" and pol.codec_for("data.1", "grad") is None
    )
