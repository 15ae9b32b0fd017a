"""The training loop: batches in, sharded steps, metrics.jsonl, checkpoints, a progress bar.

`run_loop` is the one loop body; a `Runner` holds what differs per transport (`XlaRunner` here,
`jaxhc.train.mpi.MpiRunner` for one process per device under mpirun).
"""

from __future__ import annotations

import abc
import contextlib
import json
import math
import os
import shutil
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import jaxhc
from jaxhc.data import VOCAB_SIZE, Dataset
from jaxhc.data.dataset import TOKENIZER
from jaxhc.model import validate
from jaxhc.parallel import TrainState, init_state, make_eval_loss, make_mesh, make_train_step
from jaxhc.parallel.fidelity import METRICS as FIDELITY
from jaxhc.parallel.state import Plan, shardings
from jaxhc.train.checkpoint import Checkpoints, Group, all_finite
from jaxhc.train.config import ExperimentConfig
from jaxhc.train.progress import Progress


def flops_per_token(cfg, n_params: int) -> float:
    """Training FLOPs per token: 6N for the dense math plus attention (PaLM appendix B)."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def train(
    cfg: ExperimentConfig, out_dir: str, *, resume: bool = False, progress: bool | Progress = True
) -> dict:
    """Train `cfg` on this process's devices (the XLA transport), writing `metrics.jsonl`,
    `config.json` and checkpoints into `out_dir`.

    With ``resume=True`` the run continues from the latest checkpoint in `out_dir`; batches depend
    only on (seed, step), so the losses after resuming equal those of an uninterrupted run.
    Returns a summary of the last step. `jaxhc.train.mpi.train_mpi` is the same loop with one
    process per device.
    """
    if cfg.transport != "xla":
        raise ValueError(f"transport={cfg.transport!r}: run it with `jaxhc train` under mpirun")
    devices = jax.devices()
    check_config(cfg, len(devices))
    return run_loop(cfg, out_dir, XlaRunner(cfg, devices), resume=resume, progress=progress)


def check_config(cfg: ExperimentConfig, n_devices: int) -> None:
    """The checks every transport makes before anything runs (one-line errors naming the key)."""
    validate(cfg.model, cfg.mesh, batch_size=cfg.train.batch_size, n_devices=n_devices)
    if cfg.data is None and cfg.model.vocab_size < VOCAB_SIZE:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} must be >= {VOCAB_SIZE} (bytes)")


class Runner(abc.ABC):
    """What differs between transports in the training loop: where the state lives, how a step and
    an eval run, how the state reaches a checkpoint, and whether this process writes the files.

    Every process of a run calls the same methods in the same order (MPI runners communicate in
    them). Values of `state` are the runner's own (sharded `jax.Array`s, or a process's blocks).
    """

    writer: bool = True  # this process writes metrics.jsonl, config.json, progress
    devices: list[str]  # for config.json
    group: Group = Group()  # the processes that checkpoint together
    plan: Plan  # shapes and layouts of the state on this mesh

    def raise_if_any(self, error: str | None) -> None:
        """Raise ValueError(error) on every process if any process passes an error."""
        if error:
            raise ValueError(error)

    @abc.abstractmethod
    def init_state(self, init=None) -> TrainState:
        """The fresh state: parameters from ``train.seed``, or from ``init()`` (single-layout host
        arrays, called on the processes that need them) when `init` is given."""

    @abc.abstractmethod
    def restore(self, checkpoints: Checkpoints, state: TrainState) -> TrainState:
        """The latest checkpoint's state, laid out for this mesh (whatever mesh wrote it)."""

    @abc.abstractmethod
    def step(
        self, state: TrainState, tokens: np.ndarray, warm: bool = False
    ) -> tuple[TrainState, dict]:
        """One train step on the global batch; returns the new state and host metrics. `warm`:
        a warm-up step, run under the policy's `jaxhc.Policy.warming` (its ``warmup_steps``)."""

    @abc.abstractmethod
    def eval_loss(self, params, tokens: np.ndarray) -> float: ...

    @abc.abstractmethod
    def step_stats(self, ledger, seconds: float) -> tuple[dict, float]:
        """The step's traffic per axis (per device, as `Ledger.per_axis`) and its seconds."""

    @abc.abstractmethod
    def save(self, checkpoints: Checkpoints, step: int, state: TrainState) -> bool:
        """Checkpoint `state` as `step`; False when it was not finite (and nothing was saved)."""


class ProcessGroup(Group):
    """The processes of a `jax.distributed` job, checkpointing together. Small control messages
    (JSON: tokens, errors, file digests) travel as bytes through jax's own cross-process
    all-gather (`multihost_utils.process_allgather`)."""

    def __init__(self):
        self.rank, self.size = jax.process_index(), jax.process_count()

    def all_gather(self, value) -> list:
        from jax.experimental import multihost_utils

        data = np.frombuffer(json.dumps(value).encode(), np.uint8)
        sizes = multihost_utils.process_allgather(np.int32(data.size))
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[: data.size] = data
        rows = multihost_utils.process_allgather(padded)
        return [json.loads(rows[r, : sizes[r]].tobytes()) for r in range(self.size)]

    def bcast(self, value):
        return self.all_gather(value)[0]

    def all_true(self, flag):
        return all(self.all_gather(bool(flag)))

    def first_error(self, error):
        errors = self.all_gather(error)
        return next((f"process {r}: {e}" for r, e in enumerate(errors) if e), None)


class XlaRunner(Runner):
    """`shard_map` over the devices of this process, or of every process of a `jax.distributed`
    job (`jaxhc.launch.init_distributed`); sharded `jax.Array` state. In a job of several
    processes every process feeds its own devices' rows of the (identical) global batch, process
    0 writes the metrics and the run's files, and each process writes and reads its own devices'
    pieces of the checkpoints."""

    def __init__(self, cfg: ExperimentConfig, devices):
        self.cfg = cfg
        self.devices = [str(d) for d in devices]
        if jax.process_count() > 1:
            self.writer = jax.process_index() == 0
            self.group = ProcessGroup()
        self.mesh = make_mesh(cfg.mesh, devices)
        policy = cfg.policy
        self.plan = Plan(cfg.model, cfg.mesh, cfg.optim, policy)
        self._steps = step_programs(cfg, self._make_step)
        self._eval = make_eval_loss(cfg.model, cfg.mesh, self.mesh, policy)

    def _make_step(self, policy):
        cfg = self.cfg
        return make_train_step(
            cfg.model,
            cfg.mesh,
            cfg.optim,
            self.mesh,
            policy,
            cfg.train.fidelity_every,
            cfg.train.overlap,
        )

    def init_state(self, init=None):
        cfg = self.cfg
        params = None if init is None else init()
        return init_state(
            cfg.model, cfg.mesh, cfg.optim, self.mesh, cfg.train.seed, params, policy=cfg.policy
        )

    def raise_if_any(self, error):
        error = self.group.first_error(error) if jax.process_count() > 1 else error
        if error:
            raise ValueError(error)

    def _coords(self):
        """Each device of this process with its mesh coordinates."""
        for idx, device in np.ndenumerate(self.mesh.devices):
            if device.process_index == jax.process_index():
                yield dict(zip(self.mesh.axis_names, map(int, idx), strict=True)), device

    def _place(self, tokens: np.ndarray):
        """The global batch (the same on every process) split over "data"; each process makes
        only its own devices' blocks."""
        if jax.process_count() == 1:
            return tokens
        sharding = NamedSharding(self.mesh, PartitionSpec("data"))
        return jax.make_array_from_callback(tokens.shape, sharding, lambda idx: tokens[idx])

    def restore(self, checkpoints, state):
        coords, devices = zip(*self._coords(), strict=True)
        per_leaf = [[] for _ in jax.tree.leaves(state)]
        blocks = checkpoints.restore(self.plan, coords)
        for device, (_, leaves) in zip(devices, blocks, strict=True):
            for arrays, x in zip(per_leaf, leaves, strict=True):
                arrays.append(jax.device_put(x, device))
        specs = jax.tree.leaves(shardings(self.mesh, self.plan.state_specs))
        leaves = [
            jax.make_array_from_single_device_arrays(x.shape, s, arrays)
            for x, s, arrays in zip(jax.tree.leaves(state), specs, per_leaf, strict=True)
        ]
        return jax.tree.unflatten(jax.tree.structure(state), leaves)

    def step(self, state, tokens, warm=False):
        state, metrics = self._steps[warm](state, self._place(tokens))
        return state, jax.device_get(metrics)

    def eval_loss(self, params, tokens):
        return float(self._eval(params, self._place(tokens)))

    def step_stats(self, ledger, seconds):
        # the collectives of this process's devices reach its ledger
        local = sum(d.process_index == jax.process_index() for d in self.mesh.devices.flat)
        return ledger.per_axis(devices=local), seconds

    def save(self, checkpoints, step, state):
        leaves = jax.tree.leaves(state)
        shards = [{s.device: s.data for s in x.addressable_shards} for x in leaves]

        def blocks():
            for c, device in self._coords():
                yield c, [s[device] for s in shards]

        return checkpoints.save(step, self.plan, blocks(), finite=all_finite(state))


def step_programs(cfg: ExperimentConfig, make_step) -> dict:
    """``{False: the steady step, True: the warm-up step}`` from ``make_step(policy)``; the
    warm-up step (`jaxhc.Policy.warming`) only where ``warmup_steps`` asks for one. Both keep the
    same train state (a one-line error where the warm-up policy would not)."""
    policy = cfg.policy
    steps = {False: make_step(policy)}
    if policy.warmup_steps:
        warm = policy.warming()
        if (
            Plan(cfg.model, cfg.mesh, cfg.optim, warm).state_specs
            != Plan(cfg.model, cfg.mesh, cfg.optim, policy).state_specs
        ):
            raise ValueError(
                f"policy {policy.name}: warmup_codec={warm.codec_for('data', 'grad').spec!r} "
                "changes the train state (error feedback): choose a lossy warm-up codec"
            )
        steps[True] = make_step(warm)
    return steps


def run_loop(
    cfg: ExperimentConfig,
    out_dir: str,
    runner: Runner,
    *,
    resume: bool,
    progress: bool | Progress,
) -> dict:
    """The training loop of every transport: batches, timing, traffic, metrics records, eval and
    checkpoint cadence, progress, resume. Returns the last record (on a writer; {} elsewhere)."""
    writer = runner.writer
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    error = None
    if writer and not resume and os.path.exists(metrics_path) and os.path.getsize(metrics_path):
        error = f"--out {out_dir} already holds a run: pass --resume or choose another --out"
    runner.raise_if_any(error)
    if writer:
        os.makedirs(out_dir, exist_ok=True)

    batches, error = None, None
    try:
        batches = open_data(cfg, checksum=writer).batches(
            cfg.train.batch_size, cfg.model.block_size, cfg.train.seed
        )
    except ValueError as e:
        error = str(e)
    runner.raise_if_any(error)
    if writer and cfg.data is not None:  # `jaxhc generate` and `export` decode with it
        shutil.copyfile(os.path.join(cfg.data.path, TOKENIZER), os.path.join(out_dir, TOKENIZER))
    state = runner.init_state(_init_params(cfg) if cfg.init and not resume else None)
    keep = cfg.train.keep_checkpoints
    checkpoints = Checkpoints(os.path.join(out_dir, "checkpoints"), keep=keep, group=runner.group)
    start = 0
    if resume:
        state = runner.restore(checkpoints, state)
        start = int(jax.device_get(state.step))
        if writer:
            _truncate_metrics(metrics_path, start)
    if writer:
        _write_config(out_dir, cfg, runner.devices)

    shapes = Plan(cfg.model, cfg.mesh).param_shapes  # global shapes, whatever a process holds
    n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(shapes))
    tokens_per_step = cfg.train.batch_size * cfg.model.block_size
    flops = flops_per_token(cfg.model, n_params) * tokens_per_step
    ledger = jaxhc.accounting.Ledger()
    record: dict = {}
    skipped_in_a_row = 0

    with contextlib.ExitStack() as stack:
        shown = Progress.of(progress) if writer else Progress(enabled=False)
        bar = stack.enter_context(shown.reporter(cfg.train.steps, start, cfg.train.eval_every))
        out = stack.enter_context(open(metrics_path, "a")) if writer else None
        for step in range(start, cfg.train.steps):
            tokens = batches.train(step)
            ledger.reset()
            t0 = time.perf_counter()
            with ledger:
                state, metrics = runner.step(state, tokens, step < cfg.policy.warmup_steps)
            seconds = time.perf_counter() - t0
            loss, skipped = float(metrics["loss"]), bool(metrics["skipped"])
            skipped_in_a_row = skipped_in_a_row + 1 if skipped else 0
            if skipped_in_a_row > cfg.train.max_skipped_steps:
                first = step - skipped_in_a_row + 1
                raise FloatingPointError(
                    f"steps {first}-{step}: gradients not finite {skipped_in_a_row} times in a row "
                    f"(train.max_skipped_steps={cfg.train.max_skipped_steps}); stopping with the "
                    f"state before step {first} (checkpoints kept)"
                )
            if not (skipped or math.isfinite(loss)):
                raise FloatingPointError(
                    f"step {step}: loss is {loss}; stopping (checkpoints kept)"
                )
            if skipped:
                bar.note(f"step {step}: gradients not finite; update skipped")
            traffic, seconds = runner.step_stats(ledger, seconds)
            record = {
                "step": step,
                "loss": loss,
                "lr": float(metrics["lr"]),
                "grad_norm": float(metrics["grad_norm"]),
                "skipped": skipped,
                **{k: float(metrics[k]) for k in FIDELITY if math.isfinite(metrics[k])},
                "seconds": seconds,
                "tokens_per_s": tokens_per_step / seconds,
                "model_tflops": flops / seconds / 1e12,
                "raw_bytes": {a: t["raw_bytes"] for a, t in traffic.items()},
                "wire_bytes": {a: t["wire_bytes"] for a, t in traffic.items()},
                "fallbacks": {a: t["fallbacks"] for a, t in traffic.items()},
            }
            last = step + 1 == cfg.train.steps
            if (step + 1) % cfg.train.eval_every == 0 or last:
                record["val_loss"] = float(
                    np.mean(
                        [
                            runner.eval_loss(state.params, batches.val(i))
                            for i in range(cfg.train.eval_batches)
                        ]
                    )
                )
            if out is not None:
                out.write(json.dumps(record) + "\n")
                out.flush()
            if (step + 1) % cfg.train.ckpt_every == 0 or last:
                if not runner.save(checkpoints, step + 1, state):
                    bar.note(f"step {step + 1}: state is not finite; checkpoint skipped")
            bar.update(record)
    return record if writer else {}


def open_data(cfg: ExperimentConfig, checksum: bool = True) -> Dataset:
    """The run's dataset: ``data.path`` (its shards checked, their SHA-256 too when `checksum`
    and ``data.checksum``), or the embedded corpus."""
    if cfg.data is None:
        return Dataset.embedded()
    return Dataset.open(cfg.data.path, checksum=checksum and cfg.data.checksum)


def _init_params(cfg: ExperimentConfig):
    """A loader of the parameters of ``init: hf:PATH`` for `cfg.model`."""
    from jaxhc.model.hf_io import initial_params

    return lambda: initial_params(cfg.model, cfg.init[3:])


def _truncate_metrics(path: str, start: int) -> None:
    """Drop records of steps >= start (written after the checkpoint we resume from)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        keep = [line for line in f if line.strip() and json.loads(line)["step"] < start]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
    os.replace(tmp, path)


def _write_config(out_dir: str, cfg: ExperimentConfig, devices) -> None:
    resolved = {
        **cfg.to_dict(),
        "policy": cfg.policy.to_dict(),
        "jaxhc": jaxhc.__version__,
        "jax": jax.__version__,
        "devices": [str(d) for d in devices],
    }
    tmp = os.path.join(out_dir, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(resolved, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, "config.json"))
