"""Processes that tests/test_faults.py kills while they write checkpoints.

python tests/checkpoint_job.py big DIR     # saves step 1, then step 2, of a 128 MB state, forever
python tests/checkpoint_job.py train DIR   # `jaxhc train` of a tiny model, 4 steps, checkpoints
                                           # after 2 and 4; SIGKILLed once Orbax has written step
                                           # 4 but before jaxhc has recorded its manifest
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

N = 32 << 20  # float32 values: 128 MB, incompressible, so that a save takes a while


def big_state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.random(N, dtype=np.float32), "step": np.int32(step)}


def big(directory: str) -> None:
    from jaxhc.train.checkpoint import Checkpoints

    checkpoints = Checkpoints(directory)
    checkpoints.save(1, big_state(1))
    print("saved 1", flush=True)
    checkpoints.save(2, big_state(2))  # the test kills this process while this runs
    print("saved 2", flush=True)


def train(out: str) -> None:
    from jaxhc import cli
    from jaxhc.train.checkpoint import Checkpoints

    write_manifest = Checkpoints._write_manifest

    def killed_at_step_4(self, step):
        if step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        write_manifest(self, step)

    Checkpoints._write_manifest = killed_at_step_4
    cli.main(["train", "--out", out, "--no-progress", "--steps", "4", *sys.argv[3:]])
    print("finished; it should have been killed", flush=True)


if __name__ == "__main__":
    {"big": big, "train": train}[sys.argv[1]](sys.argv[2])
