"""The peer across shaped links: PyTorch DDP over gloo, one rank per host, per communication hook.

`run_hook` trains jaxhc's experiment with `bench/links/ddp.py` in every host of a live cluster
(one process per host, as `Cluster.run_distributed` starts a jax.distributed job) and summarizes
its metrics.jsonl as `bench.links.train.summarize` does jaxhc's. A hook that fails (PowerSGD has
aborted under gloo) gives a row with ``failed``: the error line, not a missing row.

Hooks: ``none`` (DDP's bucketed all-reduce of float32 gradients), ``fp16`` and ``bf16``
(`fp16_compress_hook`, `bf16_compress_hook`: gradients cast for the all-reduce), ``powersgd``
(`powerSGD_hook`, rank `POWERSGD`, from step 2 on: the timed steps are all compressed; in one
gradient bucket, as with DDP's 25 MiB buckets it hung under gloo here). `bf16_compress_hook` needs
CUDA and NCCL: under gloo its row records DDP's refusal.

DDP's bytes on the wire are *computed*, not counted (gloo reports none): a ring all-reduce sends
2(P-1)/P x the message per rank, the message being the gradients (float32; half that under the
fp16/bf16 hooks; PowerSGD's P and Q factors plus the tensors it leaves uncompressed).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

from .cluster import COORDINATOR_PORT, IFACE, Cluster, ClusterError

__all__ = [
    "HOOKS",
    "POWERSGD",
    "error_line",
    "failure",
    "parse_hooks",
    "ring_factor",
    "run_hook",
    "threads",
    "wire_bytes",
]

HOOKS = ("none", "fp16", "bf16", "powersgd")
# PowerSGD as its documentation suggests trying first, but compressing from step 2 (its default
# start, step 1000, would leave every step of a short run uncompressed; error feedback and warm
# start need the start after step 1).
POWERSGD = {
    "matrix_approximation_rank": 1,
    "start_powerSGD_iter": 2,
    "min_compression_rate": 2.0,
    "use_error_feedback": True,
    "warm_start": True,
}
PORT = COORDINATOR_PORT + 1  # the peer's rendezvous (TCPStore) in host 0
THREADS_NOTE = (
    "torch.set_num_threads = the cores each rank may run on, as jaxhc's ranks: XLA:CPU sizes its "
    "thread pool by the CPU affinity, and both run one rank per host, the hosts sharing the "
    "machine's cores"
)
WIRE_NOTE = (
    "computed, not counted: 2(P-1)/P x the all-reduced bytes per rank (a ring); float32 "
    "gradients, half under fp16/bf16, PowerSGD's factors plus what it leaves uncompressed"
)


def parse_hooks(text: str | None) -> list[str]:
    """``"none,fp16"`` -> ["none", "fp16"]; "" or None -> []; an unknown hook is a ValueError."""
    hooks = [h.strip().lower() for h in (text or "").split(",") if h.strip()]
    for h in hooks:
        if h not in HOOKS:
            raise ValueError(f"--peer {text!r}: unknown hook {h!r} (hooks: {', '.join(HOOKS)})")
    return hooks


def threads() -> int:
    """The torch threads of a peer rank: the cores this process may run on (`THREADS_NOTE`)."""
    return len(os.sched_getaffinity(0))


def ring_factor(parts: int) -> float:
    """Bytes a rank sends in a ring all-reduce, per byte of the message: 2(P-1)/P."""
    return 2 * (parts - 1) / parts


def wire_bytes(
    shapes: list[tuple[int, ...]], hook: str, parts: int, *, step: int | None = None,
    powersgd: dict = POWERSGD,
) -> tuple[float, float]:  # fmt: skip
    """(raw, wire): the bytes one rank sends per step, all-reducing gradients of `shapes`
    (float32) over `parts` ranks in a ring, plainly (raw) and under `hook` (wire).

    PowerSGD, as torch's `powerSGD_hook`: before ``start_powerSGD_iter`` (`step` below it) a plain
    all-reduce; then a tensor of shape (n, ...) as an n x m matrix is compressed to rank
    k = min(n, m, rank) when (n + m) k x ``min_compression_rate`` < n m, and its factors P (n x k)
    and Q (m x k) are all-reduced in float32; 1-D tensors and the rest go uncompressed.
    """
    if hook not in HOOKS:
        raise ValueError(f"hook {hook!r}: expected one of {', '.join(HOOKS)}")
    words = sum(math.prod(s) for s in shapes)
    raw = 4.0 * words * ring_factor(parts)
    if hook == "none":
        return raw, raw
    if hook in ("fp16", "bf16"):
        return raw, raw / 2
    if step is not None and step < powersgd["start_powerSGD_iter"]:
        return raw, raw
    sent = 0
    for shape in shapes:
        n = math.prod(shape)
        if len(shape) <= 1:
            sent += n
            continue
        rows, cols = shape[0], n // shape[0]
        k = min(rows, cols, powersgd["matrix_approximation_rank"])
        compressed = (rows + cols) * k
        sent += compressed if compressed * powersgd["min_compression_rate"] < n else n
    return raw, 4.0 * sent * ring_factor(parts)


_RANK = re.compile(r"^\[rank\d+\]:\s?")  # torch's prefix on a rank's error output
_WHAT = re.compile(r"what\(\):\s*(.+)")
_ERROR = re.compile(r"^\s*([\w.:]*(Error|Exception|EnforceNotMet)\b.*)$")
_CALLBACK = "Got the following error when running the callback: "
# What a rank reports when another one died first: not the cause.
_ECHO = re.compile(r"Connection (reset|closed) by peer|remote worker", re.IGNORECASE)


def error_line(output: str) -> str | None:
    """The line of a failed rank's output that says why: a C++ exception's what(), else the last
    Python exception line, else the last non-empty line (None: no output)."""
    lines = [_RANK.sub("", line).rstrip() for line in (output or "").splitlines()]
    lines = [line for line in lines if line.strip()]
    for pattern in (_WHAT, _ERROR):
        found = [m.group(1).strip() for m in map(pattern.search, lines) if m]
        if found:
            line = found[-1]
            while _CALLBACK in line:  # torch's nesting of an error raised in a future's callback
                line = line[line.index(_CALLBACK) + len(_CALLBACK) :]
            return line[:400]
    return lines[-1].strip()[:400] if lines else None


def failure(done: list) -> dict | None:
    """None when every rank of `done` (CompletedProcess per host, output in stdout) exited 0;
    else ``failed``: the first failed rank's error line that is not an echo of another rank's
    failure (connection reset by the peer), and each failed rank's last output lines."""
    bad = [(i, d) for i, d in enumerate(done) if d.returncode != 0]
    if not bad:
        return None
    lines = [(i, error_line(d.stdout or "")) for i, d in bad]
    said = [(i, line) for i, line in lines if line]
    cause = next(((i, x) for i, x in said if not _ECHO.search(x)), said[0] if said else None)
    if cause is None:
        cause = (bad[0][0], f"exit status {bad[0][1].returncode}")
    tails = {str(i): "\n".join((d.stdout or "").splitlines()[-40:]) for i, d in bad}
    return {"failed": f"host {cause[0]}: {cause[1]}", "output_tails": tails}


def run_hook(
    cluster: Cluster, hook: str, *, config: str, overrides: list[str], steps: int | None,
    run_dir: str, timeout: float, summarize, torch_threads: int | None = None,
) -> dict:  # fmt: skip
    """Train with DDP hook `hook` across `cluster`: a summary row (`summarize` of its metrics,
    plus the peer's settings), or ``{"failed": <error line>}`` when a rank failed. `torch_threads`:
    torch threads per rank (None: `threads()`)."""
    cmd = [sys.executable, "-m", "bench.links.ddp", "--config", config, "--hook", hook]
    cmd += ["--out", run_dir, "--threads", str(torch_threads or threads())]
    if steps:
        cmd += ["--steps", str(steps)]
    cmd += list(overrides)
    env = {"GLOO_SOCKET_IFNAME": IFACE, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    done = cluster.run_distributed(
        cmd, timeout=timeout, env=env, capture=True, check=False, grace=30.0, port=PORT
    )
    failed = failure(done)
    if failed:
        return failed
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        with open(os.path.join(run_dir, "peer.json")) as f:
            meta = json.load(f)
    except FileNotFoundError as e:
        raise ClusterError(f"DDP {hook}: the run wrote no {os.path.basename(e.filename)}") from None
    return {**summarize(records), "peer": meta}
