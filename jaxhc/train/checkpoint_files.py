"""The files of a sharded checkpoint (`jaxhc.train.checkpoint`): where each canonical array's zarr
store lies (`kvstore`, `Arrays`), which files there are, their sizes and SHA-256 hashes recorded at
save time, and the checks of them at restore time, each process taking a share; `Group`, the
processes that checkpoint together.
"""

from __future__ import annotations

import hashlib
import json
import os

import tensorstore as ts

from jaxhc.data.sources import hash_file

__all__ = [
    "FORMAT",
    "META",
    "TOKEN",
    "Arrays",
    "Group",
    "damage",
    "digest",
    "files",
    "hash_share",
    "kvstore",
]

FORMAT = "jaxhc-sharded-1"
META = "meta.json"
TOKEN = ".token"


class Group:
    """The processes that checkpoint together: here this process alone (`jaxhc.train.mpi` has
    the MPI one). Every process calls the same methods in the same order."""

    rank = 0
    size = 1

    def all_gather(self, value) -> list:
        """Every process's `value`, in rank order, on every process."""
        return [value]

    def bcast(self, value):
        """Process 0's `value`, on every process."""
        return value

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` is true on every process."""
        return flag

    def first_error(self, error: str | None) -> str | None:
        """The first process's error (naming it), on every process; None if there is none."""
        return error


def kvstore(root: str, name: str) -> dict:
    """The tensorstore key-value store of canonical array `name` under `root` (a folder per
    ``/``-separated part of the name)."""
    return {"driver": "file", "path": os.path.join(root, *name.split("/")) + "/"}


class Arrays:
    """The zarr arrays of the checkpoint folder `root`, by canonical name, each opened once."""

    def __init__(self, root: str, context: ts.Context):
        self.root = root
        self.context = context
        self._open: dict = {}

    def __getitem__(self, name: str):
        if name not in self._open:
            spec = {"driver": "zarr", "kvstore": kvstore(self.root, name)}
            self._open[name] = ts.open(spec, open=True, context=self.context).result()
        return self._open[name]


def files(root: str) -> list[str]:
    """Every file under `root` but meta.json and the save's token, relative, sorted."""
    out = []
    for parent, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(parent, n), root) for n in names]
    return sorted(r for r in out if r not in (META, TOKEN))


def hash_share(root: str, group: Group) -> dict:
    """This process's share of the files under `root`: relative path -> [bytes, sha256]."""
    share = files(root)[group.rank :: group.size]
    return {
        r: [os.path.getsize(os.path.join(root, r)), hash_file(os.path.join(root, r))] for r in share
    }


def damage(root: str, meta: dict, group: Group) -> str | None:
    """What is wrong with this process's share of the files of a step (None: nothing)."""
    recorded = meta.get("files", {})
    names = sorted(set(recorded) | set(files(root)))
    for rel in names[group.rank :: group.size]:
        path = os.path.join(root, rel)
        if rel not in recorded:
            return f"checkpoint file {path} was not part of the save"
        if not os.path.exists(path):
            return f"checkpoint file {path} is missing"
        size, digest = recorded[rel]
        if os.path.getsize(path) != size:
            got = os.path.getsize(path)
            return f"checkpoint file {path} is corrupt: {got} bytes, {size} when written"
        if hash_file(path) != digest:
            return f"checkpoint file {path} is corrupt: its bytes differ from when written"
    return None


def digest(meta: dict) -> str:
    """SHA-256 of meta.json's content without its own digest (key order fixed)."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
