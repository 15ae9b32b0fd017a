"""A finished (or interrupted) training run read back: its model, parameters and tokenizer.

A run directory of `jaxhc train` holds ``config.json`` (the resolved config), ``checkpoints/``
(sharded; any mesh reads them) and, for a run on a prepared dataset, that dataset's
``tokenizer.json`` (a run on the embedded corpus uses the bytes tokenizer). The parameters are
read from a checkpoint in their single layout, whatever mesh wrote it: tools here run the model on
one device.
"""

from __future__ import annotations

import os

import numpy as np

from jaxhc.data import Tokenizer
from jaxhc.data.dataset import TOKENIZER
from jaxhc.model.config import GPTConfig
from jaxhc.schema import read_json
from jaxhc.train.checkpoint import Checkpoints

__all__ = ["Run"]


class Run:
    """The run directory `path`: ``model`` (its GPTConfig), ``params(step)``, ``tokenizer()``."""

    def __init__(self, path: str):
        self.path = path
        file = os.path.join(path, "config.json")
        if not os.path.isdir(path):
            raise ValueError(f"--run {path}: no such folder (a run directory of jaxhc train)")
        self.config = read_json(file, f"--run {path} is not a run directory: it has no config.json")
        try:
            self.model = GPTConfig(**self.config["model"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{file}: not a jaxhc run config ({e})") from None
        self.data = (self.config.get("data") or {}).get("path")

    def params(self, step: int | None = None) -> tuple[int, dict]:
        """(step, single-layout float32 parameters) of checkpoint `step` (default: the latest)."""
        checkpoints = Checkpoints(os.path.join(self.path, "checkpoints"))
        if not checkpoints.steps():
            raise ValueError(f"--run {self.path} has no checkpoint yet")
        if step is not None and step not in checkpoints.steps():
            have = ", ".join(map(str, checkpoints.steps())) or "none"
            raise ValueError(f"--step {step}: {self.path} has no checkpoint of it (steps: {have})")
        step, arrays = checkpoints.read_arrays("params/", step)
        params: dict = {}
        for name, value in arrays.items():
            *parents, leaf = name.split("/")[1:]
            node = params
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = np.asarray(value, np.float32)
        return step, params

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the run was trained with."""
        file = os.path.join(self.path, TOKENIZER)
        if os.path.exists(file):
            return Tokenizer.from_file(file)
        if self.data is not None:
            raise ValueError(f"{self.path} has no {TOKENIZER} (its data: {self.data})")
        return Tokenizer.bytes()
