"""Failure behaviour of MPI jobs: a rank that raises ends the job; ranks must agree on shapes."""

from __future__ import annotations

import hashlib
import sys
import threading
import traceback

import numpy as np

_INSTALLED = False


class RankMismatchError(RuntimeError):
    """The ranks of an MPI job called a collective program with different arguments.

    >>> from jaxhc.launch import RankMismatchError
    >>> raise RankMismatchError("ranks disagree on the step's arguments: ...")
    Traceback (most recent call last):
    jaxhc.launch.RankMismatchError: ranks disagree on the step's arguments: ...
    """

    __module__ = "jaxhc.launch"


def install_abort_hook(comm=None) -> None:
    """Make an uncaught exception on any rank end the whole MPI job (`MPI_Abort`) with its message.

    Without this, the other ranks wait forever in their next collective. The hook prints the
    traceback prefixed with the rank, then aborts with error code 1; mpirun then stops every rank.
    Exceptions in other threads abort too. Installed once per process; idempotent.

    >>> from jaxhc.launch import install_abort_hook
    >>> install_abort_hook()          # one process: an exception still prints as usual
    """
    global _INSTALLED
    if _INSTALLED:
        return
    from mpi4py import MPI

    comm = comm if comm is not None else MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    previous = sys.excepthook

    def abort(exc_type, exc, tb):
        if size == 1 or issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
            return
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stdout.flush()
        sys.stderr.write(
            f"[jaxhc] rank {rank} of {size} raised; aborting the MPI job:\n"
            + "".join(f"[rank {rank}] {line}\n" for line in text.rstrip().splitlines())
        )
        sys.stderr.flush()
        comm.Abort(1)

    def abort_thread(args):
        abort(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = abort
    threading.excepthook = abort_thread
    _INSTALLED = True


def describe(tree) -> str:
    """A stable text of a pytree's structure, shapes and dtypes (what ranks must agree on)."""
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    shapes = ", ".join(
        f"{np.dtype(getattr(x, 'dtype', type(x))).name}{list(np.shape(x))}" for x in leaves
    )
    return f"{treedef} [{shapes}]"


def check_agreement(comm, what: str, text: str) -> None:
    """Raise `RankMismatchError` on every rank unless every rank of `comm` passed the same `text`.

    One 8-byte allgather per call; on mismatch the texts are gathered for the message. Every rank
    raises the same error, so no rank is left waiting in a collective.

    >>> from mpi4py import MPI
    >>> from jaxhc.launch import check_agreement
    >>> check_agreement(MPI.COMM_WORLD, "the step's arguments", "float32[4, 8]")  # all agree
    """
    if comm.Get_size() == 1:
        return
    digest = np.frombuffer(hashlib.blake2b(text.encode(), digest_size=8).digest(), np.uint64)
    digests = np.empty(comm.Get_size(), np.uint64)
    comm.Allgather(digest, digests)
    if (digests == digests[0]).all():
        return
    texts = comm.allgather(text)
    lines = "\n".join(f"  rank {r}: {t}" for r, t in enumerate(texts))
    raise RankMismatchError(f"ranks disagree on {what}:\n{lines}")
