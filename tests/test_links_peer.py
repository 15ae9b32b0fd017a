"""bench/links' training peer: PyTorch DDP over gloo beside jaxhc across the shaped links.

Without torch (CI): the options, the wire-byte arithmetic (against a ring all-reduce simulated
here, byte by byte), the error line of a failed rank, and the report of synthetic runs. With torch
and transformers: transformers' torch GPT-2 loaded with jaxhc's parameters computes jaxhc's
logits, PowerSGD's computed bytes are the ones torch's hook reports, and (slow, root) a short
run across two namespace hosts trains DDP from jaxhc's starting point to jaxhc's losses.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import mpi_helpers as h
import numpy as np
import pytest

from bench.links import peer, train, train_report

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "bench.links"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], cwd=ROOT, capture_output=True, text=True)


def test_hooks_and_options_fail_in_one_line_before_a_cluster_is_made():
    assert peer.parse_hooks("none, FP16,bf16") == ["none", "fp16", "bf16"]
    assert peer.parse_hooks("") == [] and peer.parse_hooks(None) == []
    for argv, msg in [
        (["peer", "--hooks", "none,fp32"], "--peer 'none,fp32': unknown hook 'fp32'"),
        (["train", "--peer", "int8"], "--peer 'int8': unknown hook 'int8'"),
        (["train", "--policies", ""], "nothing to train: give --policies and/or --peer"),
        (["peer", "--hosts", "2,1"], "--hosts '2,1': expected whole numbers >= 2"),
        (["peer", "--rate", "1gb"], "bad link rate '1gb'"),
        (["train", "--steps", "3"], "--steps 3: expected more than the 3 untimed ones"),
        (["peer", "--peer-threads", "0"], "--peer-threads 0: expected a whole number >= 1"),
    ]:
        proc = _cli(*argv)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc
        assert lines[0].startswith(f"bench-links: {msg}"), proc


def _ring_allreduce_bytes(n: int, parts: int, itemsize: int) -> int:
    """Bytes rank 0 sends in a ring all-reduce of n values over `parts` ranks, by running one:
    a reduce-scatter then an all-gather, chunk by chunk round the ring."""
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(n) for _ in range(parts)]
    chunks = [np.array_split(d.copy(), parts) for d in data]
    sent = 0
    for phase in ("reduce", "gather"):
        for s in range(parts - 1):
            moves = []
            for r in range(parts):
                c = (r - s + (0 if phase == "reduce" else 1)) % parts
                moves.append((r, (r + 1) % parts, c, chunks[r][c].copy()))
            for src, dst, c, payload in moves:
                if src == 0:
                    sent += payload.size * itemsize
                if phase == "reduce":
                    chunks[dst][c] = chunks[dst][c] + payload
                else:
                    chunks[dst][c] = payload
    total = np.sum(data, axis=0)
    for r in range(parts):
        np.testing.assert_allclose(np.concatenate(chunks[r]), total, rtol=1e-12)
    return sent


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_computed_wire_bytes_are_a_ring_all_reduce(parts):
    shapes = [(12, 8), (12,), (5, 2, 6)]  # 96 + 12 + 60 values: chunks of equal size
    n = sum(math.prod(s) for s in shapes)
    raw, wire = peer.wire_bytes(shapes, "none", parts)
    assert raw == wire == _ring_allreduce_bytes(n, parts, 4)
    for hook in ("fp16", "bf16"):
        assert peer.wire_bytes(shapes, hook, parts) == (raw, _ring_allreduce_bytes(n, parts, 2))
    # PowerSGD, rank 1: (12, 8) -> 12 + 8 values ((12 + 8) x 2 < 96); (5, 2, 6) as 5 x 12 ->
    # 5 + 12 ((5 + 12) x 2 < 60); the bias goes as it is; all of it float32 through the ring
    _, compressed = peer.wire_bytes(shapes, "powersgd", parts, step=5)
    assert compressed == raw * (20 + 17 + 12) / n
    squat = [(3, 2)]  # (3 + 2) x 2 >= 6: left uncompressed
    assert (
        peer.wire_bytes(squat, "powersgd", parts, step=5)[1]
        == peer.wire_bytes(squat, "none", parts)[1]
    )
    start = peer.POWERSGD["start_powerSGD_iter"]
    assert peer.wire_bytes(shapes, "powersgd", parts, step=start - 1) == (raw, raw)
    with pytest.raises(ValueError, match="hook 'int8'"):
        peer.wire_bytes(shapes, "int8", parts)


def test_the_error_line_of_a_failed_rank():
    abort = (
        "step 0\nterminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= "
        "op.nbytes. 20 vs 16\n"
    )
    assert peer.error_line(abort).startswith("[enforce fail at gloo/transport/tcp/pair.cc:446]")
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "RuntimeError: Connection closed by peer [10.77.0.1]:5021\n"
    )
    assert peer.error_line(traceback) == "RuntimeError: Connection closed by peer [10.77.0.1]:5021"
    assert peer.error_line("just this\n\n") == "just this"
    assert peer.error_line("") is None


def _records(seconds: list[float], losses: list[float], wire: float, batch_tokens=128) -> list:
    out = []
    for i, (s, loss) in enumerate(zip(seconds, losses, strict=True)):
        out.append(
            {"step": i, "loss": loss, "seconds": s, "tokens_per_s": batch_tokens / s,
             "raw_bytes": {"data": 100.0}, "wire_bytes": {"data": wire},
             "fallbacks": {"data": 0.0}}
        )  # fmt: skip
    out[-1]["val_loss"] = losses[-1] + 0.5
    return out


def test_report_of_synthetic_runs():
    result = {
        "command": "python -m bench.links train ...", "config": "links.yaml", "rate": "1gbit",
        "transport": "mpi", "overrides": [], "skip_steps": train.SKIP_STEPS,
        "peer": {"system": "PyTorch DDP", "threads": 2, "threads_note": "t",
                 "wire_bytes": "computed", "powersgd": {"matrix_approximation_rank": 1}},
        "runs": [],
    }  # fmt: skip
    # the first 3 steps are left out: medians of [1, 3, 2] and [0.5, 0.25, 1.5]
    cases = [
        ("jaxhc", "policy", "none", [9, 9, 9, 1, 3, 2], 50.0),
        ("jaxhc", "policy", "zhybrid", [9, 9, 9, 0.5, 0.25, 1.5], 12.5),
        ("pytorch-ddp", "hook", "fp16", [9, 9, 9, 2, 4, 4], 25.0),
    ]
    for system, key, name, seconds, wire in cases:
        label = f"{'jaxhc' if system == 'jaxhc' else 'DDP'} {name}"
        row = train.summarize(_records(seconds, [3.0] * 5 + [2.0], wire * 1e6))
        result["runs"].append(
            {"hosts": 2, "rate": "1gbit", "system": system, key: name, "label": label, **row}
        )
    result["runs"].append(
        {"hosts": 2, "rate": "1gbit", "system": "pytorch-ddp", "hook": "powersgd",
         "label": "DDP powersgd", "failed": "host 0: [enforce fail at pair.cc:446]"}
    )  # fmt: skip
    speeds = [r["tokens_per_s"] for r in result["runs"][:3]]
    assert [r["median_step_s"] for r in result["runs"][:3]] == [2, 0.5, 4]
    assert speeds == [64, 256, 32] and result["runs"][0]["val_loss"] == 2.5
    page = train_report.markdown(result)
    rows = {line.split(" | ")[2]: line for line in page.splitlines() if line.startswith("| 2 |")}
    head = next(line for line in page.splitlines() if line.startswith("| P |"))
    assert "vs jaxhc none | vs DDP fp16" in head and "vs DDP none" not in head
    # s/step, tokens/s, vs jaxhc none, vs DDP fp16, final, val, wire
    assert rows["jaxhc zhybrid"].endswith(
        "| 0.500 | 256 | 4.00x | 8.00x | 2.0000 | 2.5000 | 12.5 |"
    )
    assert rows["DDP fp16"].endswith("| 4.000 | 32 | 0.50x | 1.00x | 2.0000 | 2.5000 | 25.0* |")
    assert "failed: host 0: [enforce fail at pair.cc:446]" in rows["DDP powersgd"]
    assert "Peer: PyTorch DDP" in page and "DDP's wire MB: computed" in page


# --- with torch and transformers (the `peer` extra) ------------------------------------------


# Under `slow`: importing transformers' torch model takes 15-40 s on 2 busy cores (CI has no torch
# either way: the peer extra is not in `dev`).
@pytest.mark.slow
def test_transformers_gpt2_with_jaxhc_parameters_computes_jaxhc_logits():
    torch = pytest.importorskip("torch", reason="the peer extra (torch) is not installed")
    transformers = pytest.importorskip("transformers")
    from bench.links.peer_model import decayed_names, gpt2_config, gpt2_state
    from jaxhc.model import gpt
    from jaxhc.model.config import GPTConfig

    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=4, n_embd=32)
    params = gpt.init_params(cfg, 3)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt2_config(cfg)))
    state = {k: torch.from_numpy(v) for k, v in gpt2_state(params, cfg).items()}
    model.load_state_dict(state, strict=True)
    idx = np.random.default_rng(0).integers(0, cfg.vocab_size, (3, cfg.block_size))
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(idx)).logits.numpy()
    want = np.asarray(gpt.logits(params, idx, cfg))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # AdamW decays the matrices and embeddings, as GPT-2 trainings do: every tensor of >= 2 axes
    named = dict(model.named_parameters())
    assert decayed_names(cfg.n_layer) == {n for n, p in named.items() if p.ndim >= 2}


@pytest.mark.slow
def test_powersgd_bytes_are_those_torch_compresses(tmp_path):
    torch = pytest.importorskip("torch", reason="the peer extra (torch) is not installed")
    transformers = pytest.importorskip("transformers")
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from bench.links.peer_model import gpt2_config
    from jaxhc.model.config import GPTConfig

    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=4, n_embd=32)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt2_config(cfg)))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = powerSGD_hook.PowerSGDState(process_group=None, **peer.POWERSGD)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
        steps = peer.POWERSGD["start_powerSGD_iter"] + 1
        for _ in range(steps):
            ddp(input_ids=x).logits.sum().backward()
        _, before, after = state.compression_stats()
    finally:
        dist.destroy_process_group()
    shapes = [tuple(p.shape) for p in model.parameters()]
    raw, wire = peer.wire_bytes(shapes, "powersgd", 2, step=steps - 1)
    factor = 4 * peer.ring_factor(2)
    # torch counts every gradient value before, and the values it all-reduces after
    assert raw / factor == before == sum(math.prod(s) for s in shapes)
    assert wire / factor == after < before / 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ddp_across_two_hosts_trains_jaxhcs_run(tmp_path):
    pytest.importorskip("torch", reason="the peer extra (torch) is not installed")
    if h.mpi_ready() is not None:  # jaxhc's rows run over MPI
        pytest.skip(h.mpi_ready())
    from bench.links import ClusterError, check_available

    try:
        check_available()
    except ClusterError as e:
        pytest.skip(f"no shaped-link cluster here: {e}")
    out = tmp_path / "peer.json"
    argv = ["peer", "--hosts", "2", "--rate", "unshaped", "--policies", "none"]
    argv += ["--hooks", "none,fp16", "--steps", "5", "--out", str(out)]
    argv += ["model.n_layer=1", "model.n_embd=96", "train.eval_every=5"]
    proc = _cli(*argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["label"]: r for r in result["runs"]}
    assert set(rows) == {"jaxhc none", "DDP none", "DDP fp16"}
    assert rows["DDP none"]["peer"]["threads"] == result["peer"]["threads"]
    # the same start, batches and AdamW: DDP without a hook ends where jaxhc does (float32
    # reductions in other orders); the fp16 hook's rounding moves it a little more
    want = rows["jaxhc none"]
    for label, tol in (("DDP none", 2e-4), ("DDP fp16", 5e-3)):
        got = rows[label]
        assert got["final_loss"] == pytest.approx(want["final_loss"], rel=tol), label
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=tol), label
    assert (out.with_suffix(".md")).exists() and (out.with_suffix(".png")).exists()
