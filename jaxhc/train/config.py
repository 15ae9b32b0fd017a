"""Experiment configuration: YAML files with sections, dotted overrides, one-line errors."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from jaxhc._checks import whole_number
from jaxhc.model.config import LLAMA_KEYS, GPTConfig, MeshConfig, OptimConfig
from jaxhc.policy import Policy
from jaxhc.schema import read_yaml, structure, yaml_value

TRANSPORTS = ("xla", "mpi")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The loop: steps, global batch, seeds, and how often to log, evaluate and checkpoint.

    ``fidelity_every``: every k steps, also reduce the gradients exactly and record the compressed
    reduction's relative error and cosine similarity (``grad_rel_err``, ``grad_cos``; see
    `jaxhc.parallel.fidelity`); 0 (default) never, as it costs a second reduction.
    ``overlap``: reduce each layer's gradients in the backward as soon as they are produced,
    while the earlier layers' backward runs, where the step can (`jaxhc.parallel.grads.overlaps`:
    unsharded parameters, one micro-batch, no fidelity sampling, error feedback only without
    ``keep_own``); the same
    bits either way. On the MPI transport the backward only starts each layer's reduction on the
    engine's progress thread (`jaxhc.collectives.started`), so its bytes move while the earlier
    layers' backward computes; ``JAXHC_MPI_ASYNC=0`` keeps the calls on the calling thread.
    """

    steps: int = 300
    batch_size: int = 16
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 4
    ckpt_every: int = 100
    keep_checkpoints: int = 3
    fidelity_every: int = 0
    # Steps whose gradients are not finite are skipped (the state stays); this many in a row end
    # the run with an error (0: the first one does).
    max_skipped_steps: int = 5
    overlap: bool = True

    def __post_init__(self):
        for key in (
            "steps",
            "batch_size",
            "eval_every",
            "eval_batches",
            "ckpt_every",
            "keep_checkpoints",
        ):
            whole_number(f"train.{key}", getattr(self, key))
        whole_number("train.seed", self.seed, least=0)
        whole_number("train.fidelity_every", self.fidelity_every, least=0)
        whole_number("train.max_skipped_steps", self.max_skipped_steps, least=0)
        if not isinstance(self.overlap, bool):
            raise ValueError(f"train.overlap={self.overlap!r} must be true or false")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """A dataset prepared by `jaxhc data prepare` to train on (without a ``data`` section: the
    embedded corpus). ``checksum``: check every shard's SHA-256 against its meta.json when the run
    starts (sizes are always checked); false skips the read for huge corpora."""

    path: str = ""
    checksum: bool = True

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"data.path={self.path!r} must name a prepared dataset folder")
        if not isinstance(self.checksum, bool):
            raise ValueError(f"data.checksum={self.checksum!r} must be true or false")


# The default run (`make train`, `jaxhc train` without --config; configs/experiments/default.yaml
# spells the same values out): a small byte-level GPT on 8 devices as data x tensor x pipe = 2x2x2.
DEFAULT_MODEL = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
DEFAULT_MESH = MeshConfig(data=2, tensor=2, pipe=2, microbatches=2)
DEFAULT_OPTIM = OptimConfig(lr=3e-3, warmup_steps=20, total_steps=300)
DEFAULT_TRAIN = TrainConfig(steps=300, batch_size=32)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """One training run. ``compression`` is a policy preset name, a policy YAML path, or a
    `Policy` (a mapping in a file: the policy inline);
    ``data`` the prepared dataset (None: the embedded corpus); ``init`` where a fresh run's
    parameters come from (None: ``train.seed``; ``hf:PATH``: a local transformers GPT-2 or
    LLaMA)."""

    name: str = "default"
    model: GPTConfig = DEFAULT_MODEL
    mesh: MeshConfig = DEFAULT_MESH
    optim: OptimConfig = DEFAULT_OPTIM
    train: TrainConfig = DEFAULT_TRAIN
    compression: str | Policy = "zhybrid"
    transport: str = "xla"
    data: DataConfig | None = None
    init: str | None = None

    def __post_init__(self):
        _check_init(self.init)
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport={self.transport!r} must be one of {', '.join(TRANSPORTS)}")
        _ = self.policy  # loaded here, once: a bad policy fails early, in one line

    @functools.cached_property
    def policy(self) -> Policy:
        """The ``compression`` policy, loaded once: what the trainer runs the program under."""
        return Policy.load(self.compression)

    def to_dict(self) -> dict:
        """The config as plain values (a `Policy` given as an object by its name)."""
        out = {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name != "compression"
        }
        policy = self.compression
        return {**out, "compression": policy.name if isinstance(policy, Policy) else policy}


def _plain(value):
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Build an ExperimentConfig from a nested mapping (`jaxhc.schema.structure`): a section's
    keys replace those of the defaults (`DEFAULT_MODEL`, ...); an unknown key, or a value of the
    wrong type, is an error of one line naming it.

    ``optim.total_steps`` defaults to ``train.steps`` (the schedule spans the run). With
    ``init: hf:PATH`` the model section follows that checkpoint's config (see `_follow_init`);
    with a ``data`` section ``model.vocab_size`` defaults to its tokenizer's (`_follow_data`).

    >>> from_dict({"model": {"n_layer": 2}, "train": {"steps": 10}}).optim.total_steps
    10
    >>> from_dict({"model": {"n_layr": 2}})
    Traceback (most recent call last):
    ValueError: unknown config key 'model.n_layr'
    """
    data = dict(data or {})
    cfg = structure(ExperimentConfig, data, base=_base())
    changes: dict[str, Any] = {}
    if "total_steps" not in (data.get("optim") or {}):
        changes["optim"] = dataclasses.replace(cfg.optim, total_steps=cfg.train.steps)
    given = set(data.get("model") or {})
    if cfg.init:
        changes["model"] = _follow_init(cfg.model, given, cfg.init)
    if cfg.data is not None:
        model = changes.get("model", cfg.model)
        changes["model"] = _follow_data(model, given, cfg.data, cfg.init)
    return dataclasses.replace(cfg, **changes) if changes else cfg


_BASE = None  # ExperimentConfig(): what a file's keys replace (made at first use)


def _base() -> ExperimentConfig:
    global _BASE
    if _BASE is None:
        _BASE = ExperimentConfig()
    return _BASE


def _check_init(init: str | None) -> str | None:
    if init is not None and not (init.startswith("hf:") and len(init) > 3):
        raise ValueError(
            f"init={init!r} must be hf:PATH (a local transformers GPT-2 or LLaMA folder)"
        )
    return init


# GPTConfig fields an `init: hf:PATH` checkpoint fixes (block_size may be smaller: the first
# positions' embeddings are kept).
INIT_FIELDS = (
    "arch",
    "vocab_size",
    "block_size",
    "n_layer",
    "n_head",
    "n_embd",
    "layer_norm_eps",
    *LLAMA_KEYS,
)


def _follow_init(model: GPTConfig, given: set, init: str) -> GPTConfig:
    """`model` with the architecture of checkpoint `init`; a given key that differs is one line
    naming both (``model.block_size`` may be smaller than the checkpoint's context)."""
    from jaxhc.model.hf_io import read_config

    hf = read_config(init[3:])
    changes = {}
    for key in INIT_FIELDS:
        theirs, ours = getattr(hf, key), getattr(model, key)
        if key not in given:
            changes[key] = theirs
        elif key == "block_size" and ours <= theirs:
            continue
        elif ours != theirs:
            more = " or less" if key == "block_size" else ""
            raise ValueError(
                f"model.{key}={ours} does not match {init}, whose config has {theirs}: "
                f"leave model.{key} out to take it from there, or give {theirs}{more}"
            )
    return dataclasses.replace(model, **changes)


def _follow_data(model: GPTConfig, given: set, data: DataConfig, init: str | None) -> GPTConfig:
    """`model` with the vocabulary of `data`'s tokenizer unless it is given (or set by `init`);
    a vocabulary smaller than the tokenizer's is one line naming both."""
    from jaxhc.data import read_meta

    vocab = int(read_meta(data.path)["tokenizer"]["vocab_size"])
    if "vocab_size" not in given and not init:
        return dataclasses.replace(model, vocab_size=vocab)
    if model.vocab_size < vocab:
        if "vocab_size" not in given:
            raise ValueError(
                f"{init} has a vocabulary of {model.vocab_size} tokens, fewer than the {vocab} "
                f"tokens of data.path={data.path}'s tokenizer"
            )
        raise ValueError(
            f"model.vocab_size={model.vocab_size} is smaller than the {vocab} tokens of "
            f"data.path={data.path}'s tokenizer: leave model.vocab_size out to take it from there"
        )
    return model


def load(path: str | None, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a YAML experiment (None: the defaults) and apply ``section.key=value`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        if not os.path.exists(path):
            raise ValueError(f"config file {path!r} does not exist")
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of config sections")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} must look like section.key=value")
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part!r} is not a section")
        node[leaf] = yaml_value(raw, f"override {item!r}")
    return from_dict(data)


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=2,tensor=2,pipe=2"`` -> {"data": 2, "tensor": 2, "pipe": 2}."""
    out = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in ("data", "tensor", "pipe", "microbatches"):
            raise ValueError(f"--mesh {text!r}: use data=N,tensor=N,pipe=N[,microbatches=N]")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            raise ValueError(
                f"--mesh {text!r}: {key.strip()}={value!r} is not an integer"
            ) from None
    return out
