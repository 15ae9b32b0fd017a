"""The network namespaces of the links cluster: making sure this process can create them, running
`ip` / `tc`, listing this tool's namespaces and removing what a killed run left behind.

Names start with `jaxhc-links-<pid>-`, pid the process that made them, so `remove_leftovers()` can
find and delete what a killed run left behind (and leaves a live run's cluster alone).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

PREFIX = "jaxhc-links-"
SUBNET = "10.77.0.0/24"
IFACE = "veth0"


class ClusterError(RuntimeError):
    """The cluster cannot be made or used (not root, no namespaces, a command failed)."""


def check_available() -> None:
    """Raise ClusterError (one line) unless this process can make network namespaces."""
    if os.geteuid() != 0:
        uid = os.geteuid()
        raise ClusterError(f"needs root to create network namespaces (running as uid {uid})")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(f"'{tool}' (iproute2) is not installed")
    probe = f"{PREFIX}{os.getpid()}-probe"
    ip("netns", "add", probe, what="cannot create network namespaces")
    ip("netns", "del", probe, what="cannot delete network namespace")


def ip(*args: str, what: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return sh(["ip", *args], what=what, check=check)


def sh(argv: list[str], what=None, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode:
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        raise ClusterError(f"{what or ' '.join(argv)}: {msg}")
    return p


def namespaces() -> list[str]:
    """This tool's namespaces on the machine (any run's)."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _owner_alive(name: str) -> bool:
    m = re.match(re.escape(PREFIX) + r"(\d+)-", name)
    if not m:
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_leftovers(*, all_runs: bool = False) -> list[str]:
    """Delete the namespaces (and agent folders) of runs whose process is gone (`all_runs`: of
    every run); returns the namespaces' names."""
    gone = [n for n in namespaces() if all_runs or not _owner_alive(n)]
    for name in gone:
        delete_namespace(name)
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")):
        if all_runs or not _owner_alive(os.path.basename(folder)):
            shutil.rmtree(folder, ignore_errors=True)
    return gone


def delete_namespace(name: str) -> None:
    """End the processes still inside `name` (TERM, then KILL after 3 s), then delete it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while _pids(name) and time.monotonic() < deadline:
            time.sleep(0.05)
    ip("netns", "del", name, check=False)


def _pids(name: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", name, check=False).stdout.split()]
