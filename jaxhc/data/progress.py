"""Progress of long data work (`jaxhc data prepare`): a rich bar on a terminal, plain lines
(every tenth of the way) anywhere else, so a log or a pipe gets no repaints."""

from __future__ import annotations

import contextlib
import sys
import time

__all__ = ["Meter"]


def _terminal() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class Meter:
    """Phases of work, each with an optional total of bytes that `advance` counts towards.

    `enabled`: None shows a live bar when stderr is a terminal and lines otherwise; False is
    silent; True shows lines or the bar as None does."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = enabled is not False
        self.live = self.enabled and _terminal()
        self._bar = None
        self._task = None
        self._done = 0
        self._total = None
        self._next = 0.0
        self._t0 = 0.0
        self._what = ""

    @contextlib.contextmanager
    def phase(self, what: str, total: int | None):
        self._what, self._total, self._done = what, total, 0
        self._next, self._t0 = 0.1, time.perf_counter()
        if not self.enabled:
            yield self
            return
        if self.live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            columns = [SpinnerColumn(), TextColumn("{task.description}")]
            if total is not None:
                columns += [BarColumn(), DownloadColumn(), TransferSpeedColumn()]
                columns.append(TimeRemainingColumn())
            self._bar = Progress(*columns, console=Console(stderr=True), transient=False)
            with self._bar:
                self._task = self._bar.add_task(what, total=total)
                yield self
            self._bar = None
            return
        print(f"{what}...", file=sys.stderr, flush=True)
        yield self
        seconds = time.perf_counter() - self._t0
        print(f"{what}: done in {seconds:.1f} s", file=sys.stderr, flush=True)

    def advance(self, n: int) -> None:
        """`n` more bytes of the phase's total done."""
        self._done += n
        if not self.enabled or self._total is None:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done)
            return
        if self._total and self._done >= self._next * self._total and self._next < 1:
            seconds = max(time.perf_counter() - self._t0, 1e-9)
            print(
                f"{self._what}: {100 * self._done / self._total:.0f} % "
                f"({self._done / 1e6:.1f} of {self._total / 1e6:.1f} MB, "
                f"{self._done / 1e6 / seconds:.1f} MB/s)",
                file=sys.stderr,
                flush=True,
            )
            while self._next <= self._done / self._total:
                self._next += 0.1
