"""Training progress: a rich bar on a terminal, plain lines every N steps anywhere else.

Under mpirun, or with output redirected to a file, a live bar would write its repaints (escape
sequences, carriage returns) into the log; there a line per `log_every` steps is printed instead.
"""

from __future__ import annotations

import dataclasses
import sys
import time

__all__ = ["Progress", "Reporter"]


@dataclasses.dataclass(frozen=True)
class Progress:
    """How a run reports progress: `enabled` (False: silent), `log_every` (plain lines every N
    steps when output is not a terminal; None: the run's ``train.eval_every``) and `live` (None:
    a rich bar only when stdout and stderr are terminals; True / False force the choice)."""

    enabled: bool = True
    log_every: int | None = None
    live: bool | None = None

    def __post_init__(self):
        if self.log_every is not None and self.log_every < 1:
            raise ValueError(f"log_every={self.log_every} must be >= 1")

    @classmethod
    def of(cls, progress: bool | Progress) -> Progress:
        return progress if isinstance(progress, Progress) else cls(enabled=bool(progress))

    def reporter(self, total: int, start: int, eval_every: int) -> Reporter:
        if not self.enabled:
            return Reporter(total, start)
        live = self.live if self.live is not None else _terminal()
        if live:
            return _Bar(total, start)
        return _Lines(total, start, self.log_every or eval_every)


def _terminal() -> bool:
    return all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr))


class Reporter:
    """A context manager fed one record per step (`update`) and occasional notes; silent here."""

    def __init__(self, total: int, start: int):
        self.total, self.start = total, start

    def __enter__(self):
        return self

    def update(self, record: dict) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def __exit__(self, *exc):
        return None


def summary(record: dict) -> str:
    """Loss, tokens/s, wire MB per step per mesh axis (scalar reductions left out)."""
    wire = " ".join(f"{a}={v / 1e6:.2f}" for a, v in record["wire_bytes"].items() if v >= 1000)
    info = (
        f"loss {record['loss']:.4f}  {record['tokens_per_s']:.0f} tok/s  wire MB/step {wire or '0'}"
    )
    if "val_loss" in record:
        info += f"  val {record['val_loss']:.4f}"
    return info


class _Lines(Reporter):
    """One plain line per `every` steps (and the first and last), flushed: readable in a log."""

    def __init__(self, total: int, start: int, every: int):
        super().__init__(total, start)
        self.every = every
        self._t0 = time.monotonic()

    def update(self, record: dict) -> None:
        done = record["step"] + 1
        if done % self.every and done != self.total and record["step"] != self.start:
            return
        elapsed = time.monotonic() - self._t0
        print(f"step {done}/{self.total}  {summary(record)}  {elapsed:.0f}s", flush=True)

    def note(self, text: str) -> None:
        print(text, flush=True)


class _Bar(Reporter):
    """A rich progress bar: step, loss, tokens/s, wire MB per step per axis, ETA."""

    def __enter__(self):
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._progress = RichProgress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
        )
        self._progress.__enter__()
        self._task = self._progress.add_task(
            "train", total=self.total, completed=self.start, info="compiling..."
        )
        return self

    def update(self, record: dict) -> None:
        self._progress.update(self._task, completed=record["step"] + 1, info=summary(record))

    def note(self, text: str) -> None:
        self._progress.console.print(text)

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)
