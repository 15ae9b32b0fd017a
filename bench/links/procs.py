"""The processes a links cluster starts: their environment, watching a group of them, ending a
process group, and saying how one ended."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def environ(*changes: dict | None) -> dict:
    env = dict(os.environ)
    for change in changes:
        for k, v in (change or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    return env


def how(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def watch(procs: list[subprocess.Popen], timeout, grace):
    """Wait for `procs`. Returns (first, later, ended): `first` the (index, seconds from the start)
    of the first process that failed, None, or "timeout"; `later` {index: seconds after that
    failure} of the processes that ended by themselves after it; `ended` the indices of those
    still running `grace` seconds after it, which this ended."""
    start = time.monotonic()
    first, later, done = None, {}, set()
    while True:
        now = time.monotonic() - start
        for i, p in enumerate(procs):
            if i not in done and p.poll() is not None:
                done.add(i)
                if first is None and p.returncode != 0:
                    first = (i, now)
                elif first is not None:
                    later[i] = now - first[1]
        if len(done) == len(procs):
            return first, later, set()
        if timeout is not None and now > timeout:
            return "timeout", later, set()
        if first is not None and now - first[1] > grace:
            left = {i for i in range(len(procs)) if i not in done}
            for i in left:
                kill_group(procs[i])
            return first, later, left
        time.sleep(0.05)


def kill_group(p: subprocess.Popen) -> None:
    """End the process group `p` leads (it was started with start_new_session)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass
    else:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # stragglers of a finished leader
        except (ProcessLookupError, PermissionError):
            pass
