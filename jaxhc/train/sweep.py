"""Sweeps: several policies trained on the same base config, seed and data, then one report.

A sweep file (``configs/experiments/hybrid-sweep.yaml``)::

    base: default.yaml          # the experiment (relative to the sweep file; none: the defaults)
    policies: [none, zhybrid]   # presets or policy YAML paths, one run each
    out: runs/sweep             # runs/sweep/<policy>/, and runs/sweep/report/
    overrides: [train.steps=50] # dotted overrides for every run

`jaxhc sweep FILE` runs it: a run already finished is kept, one interrupted is resumed.
"""

from __future__ import annotations

import dataclasses
import os

from jaxhc.schema import read_yaml, structure
from jaxhc.train.config import ExperimentConfig, load

__all__ = ["Sweep", "finished", "run"]


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A sweep file's keys (`Sweep.load` reads one).

    >>> Sweep(policies=("none", "zfp8"), overrides=("train.steps=2",)).runs()[1][0]
    'runs/sweep/zfp8'
    >>> Sweep(policies=())
    Traceback (most recent call last):
    ValueError: 'policies' must list at least one policy
    """

    policies: tuple[str, ...] = ()
    base: str | None = None
    out: str = "runs/sweep"
    overrides: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.policies:
            raise ValueError("'policies' must list at least one policy")

    @classmethod
    def load(cls, path: str) -> Sweep:
        """The sweep file `path`; ``base`` is taken relative to the file."""
        sweep = structure(cls, read_yaml(path) or {}, kind="sweep", where=path)
        if sweep.base is not None and not os.path.isabs(sweep.base):
            base = os.path.join(os.path.dirname(os.path.abspath(path)), sweep.base)
            sweep = dataclasses.replace(sweep, base=base)
        return sweep

    def select(self, names: str, file: str = "the sweep") -> Sweep:
        """The sweep with only the comma-separated policies `names` (``--policies``), each one
        of its own (`file` names the sweep in the error)."""
        chosen = tuple(p.strip() for p in names.split(",") if p.strip())
        missing = [p for p in chosen if p not in self.policies]
        if missing or not chosen:
            raise ValueError(
                f"--policies {names!r}: {missing[0] if missing else 'none given'} is not among "
                f"{file}'s policies ({', '.join(self.policies)})"
            )
        return dataclasses.replace(self, policies=chosen)

    def runs(self, overrides=(), out: str | None = None) -> list[tuple[str, ExperimentConfig]]:
        """(run directory, config) of each policy, every config loaded (and checked) before
        anything trains; `overrides` apply after the file's."""
        out = out or self.out
        runs = []
        for policy in self.policies:
            cfg = load(self.base, [*self.overrides, *overrides, f"compression={policy}"])
            runs.append((os.path.join(out, os.path.splitext(os.path.basename(policy))[0]), cfg))
        return runs


def finished(run_dir: str, cfg: ExperimentConfig) -> bool:
    """Whether `run_dir` holds the checkpoint of `cfg`'s last step."""
    from jaxhc.train.checkpoint import Checkpoints

    return Checkpoints(os.path.join(run_dir, "checkpoints")).latest_step() == cfg.train.steps


def run(runs: list[tuple[str, ExperimentConfig]], out: str, progress=None) -> str:
    """Train each of `runs` (`Sweep.runs`), resuming an interrupted run and keeping a finished
    one, then write the comparison to ``out/report``; returns the report's summary."""
    from jaxhc.train.loop import train
    from jaxhc.train.report import report

    for run_dir, cfg in runs:
        print(f"== {run_dir}", flush=True)
        resume = os.path.exists(os.path.join(run_dir, "checkpoints"))
        if not (resume and finished(run_dir, cfg)):
            train(cfg, run_dir, resume=resume, progress=progress)
    return report([d for d, _ in runs], os.path.join(out, "report"))
