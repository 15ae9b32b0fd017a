"""Processes that tests/test_faults.py kills while they write checkpoints.

python tests/checkpoint_job.py big DIR     # saves step 1, then step 2, of a ~100 MB state
python tests/checkpoint_job.py train DIR   # `jaxhc train` of a tiny model, 4 steps, checkpoints
                                           # after 2 and 4; SIGKILLed once every piece of step 4
                                           # is written but before it is committed
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from _canonical_oracle import coords_of, from_canonical

from jaxhc import partition
from jaxhc.model.config import AXES, GPTConfig, MeshConfig, OptimConfig
from jaxhc.parallel.canonical import Canonical
from jaxhc.parallel.state import Plan

# ~6.6M parameters: with the AdamW moments and the master copy ~100 MB of random float32 values
BIG = Plan(
    GPTConfig(vocab_size=256, block_size=16, n_layer=8, n_head=4, n_embd=256),
    MeshConfig(data=1, tensor=1, pipe=1),
    OptimConfig(),
)


def big_state(step: int):
    """A random train state of BIG (global host arrays), different per step."""
    rng = np.random.default_rng(step)
    canon = {
        n: np.full(a.shape, step, a.dtype)
        if a.dtype.kind == "i"
        else rng.standard_normal(a.shape, dtype=np.float32).astype(a.dtype)
        for n, a in Canonical(BIG).arrays.items()
    }
    return from_canonical(canon, BIG)


def blocks(state, plan: Plan):
    """Each device's (coords, leaves) of a state of global host arrays."""
    import jax

    shape = dict(zip(AXES, plan.mesh_cfg.shape, strict=True))
    specs = jax.tree.leaves(plan.state_specs, is_leaf=partition.is_spec)
    leaves = jax.tree.leaves(state)
    for c in coords_of(plan.mesh_cfg):
        yield c, [partition.local_block(s, x, c, shape) for s, x in zip(specs, leaves, strict=True)]


def big(directory: str) -> None:
    from jaxhc.train.checkpoint import Checkpoints

    checkpoints = Checkpoints(directory)
    checkpoints.save(1, BIG, blocks(big_state(1), BIG))
    print("saved 1", flush=True)
    checkpoints.save(2, BIG, blocks(big_state(2), BIG))  # the test kills this process meanwhile
    print("saved 2", flush=True)


def train(out: str) -> None:
    from jaxhc import cli
    from jaxhc.train.checkpoint import Checkpoints

    commit = Checkpoints._commit

    def killed_at_step_4(self, tmp, step, *args):
        if step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        commit(self, tmp, step, *args)

    Checkpoints._commit = killed_at_step_4
    cli.main(["train", "--out", out, "--no-progress", "--steps", "4", *sys.argv[3:]])
    print("finished; it should have been killed", flush=True)


if __name__ == "__main__":
    {"big": big, "train": train}[sys.argv[1]](sys.argv[2])
