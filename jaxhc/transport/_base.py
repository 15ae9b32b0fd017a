"""The transport interface: the collectives jaxhc's algorithms are written in."""

from __future__ import annotations

import abc

import jax


class Transport(abc.ABC):
    """Collectives over a named mesh axis, as the per-shard program sees them.

    jaxhc's algorithms are written against this interface; `XlaTransport` and `MpiTransport`
    implement it.

    >>> from jaxhc.transport import MpiTransport, Transport, XlaTransport
    >>> issubclass(XlaTransport, Transport), issubclass(MpiTransport, Transport)
    (True, True)
    """

    name: str

    @abc.abstractmethod
    def axis_size(self, axis_name) -> int: ...

    @abc.abstractmethod
    def axis_index(self, axis_name) -> jax.Array: ...

    @abc.abstractmethod
    def all_agree(self, flag: jax.Array, axis_name) -> jax.Array:
        """True on every rank iff `flag` (a bool scalar) is True on every rank."""

    @abc.abstractmethod
    def all_to_all_rows(self, rows: jax.Array, axis_name) -> jax.Array:
        """rows[j] goes to rank j; the result's row j came from rank j."""

    @abc.abstractmethod
    def all_gather_rows(self, row: jax.Array, axis_name) -> jax.Array:
        """Stack every rank's `row`: result[j] is rank j's row."""

    @abc.abstractmethod
    def ppermute(self, x: jax.Array, axis_name, perm) -> jax.Array: ...

    def ppermute_index(self, axis_name) -> jax.Array:
        """This rank's index as `ppermute`'s `perm` numbers it.

        `jax.lax.ppermute` numbers the ranks of a tuple of axes in mesh order whatever the tuple's
        order, unlike `axis_index` and the gathers, which follow the tuple's order.
        """
        return self.axis_index(axis_name)

    # Fused collectives: the whole compressed algorithm in one native call (the MPI transport).
    def fused(self, codec, dtype, axis_name) -> bool:
        """Whether `fused_psum` / `fused_psum_scatter` / `fused_all_gather` take this call."""
        return False

    def fused_psum(self, x: jax.Array, axis_name, codec):
        """(psum of x as jaxhc's compressed algorithm computes it, wire bytes, fell back)."""
        raise NotImplementedError

    def fused_psum_scatter(self, rows: jax.Array, axis_name, codec):
        """rows (P, m): (this rank's reduced row, wire bytes, fell back)."""
        raise NotImplementedError

    def fused_feedback(self, codec, dtype, axis_name) -> bool:
        """Whether `fused_psum_scatter_feedback` takes this call (error feedback fused)."""
        return False

    def fused_psum_scatter_feedback(self, rows: jax.Array, residual: jax.Array, axis_name, codec):
        """rows, residual (P, m) float32: (this rank's reduced row of rows + residual, the new
        residual (P, m), wire bytes, fell back), as `jaxhc.psum_scatter(..., residual=)`."""
        raise NotImplementedError

    def fused_all_gather(self, x: jax.Array, axis_name, codec):
        """((P, *x.shape) every rank's decoded x, wire bytes, fell back)."""
        raise NotImplementedError

    # Started collectives: the fused ones begun in one place and finished in another, the bytes
    # moving in between while the program computes (the MPI transport's progress threads).
    def can_start(self, codec, dtype, axis_name) -> bool:
        """Whether `start` / `done` take this call (over more than one rank) and overlap it
        with what runs in between."""
        return False

    def start(self, op: str, x: jax.Array, axis_name, codec) -> jax.Array:
        """Start the fused `op` ("psum", "psum_scatter" of rows laid end to end, "all_gather")
        of the 1-D `x`: a handle for `done`."""
        raise NotImplementedError

    def done(self, handle: jax.Array, size: int, dtype):
        """(the started call's `size` values, wire bytes, fell back), once it has finished."""
        raise NotImplementedError

    # Raw collectives with `jax.lax` semantics: the fallback path and the codec=None path.
    @abc.abstractmethod
    def psum(self, x, axis_name): ...

    @abc.abstractmethod
    def all_gather(self, x, axis_name, *, axis=0, tiled=False, **kw): ...

    @abc.abstractmethod
    def psum_scatter(self, x, axis_name, *, scatter_dimension=0, tiled=False): ...

    @abc.abstractmethod
    def all_to_all(self, x, axis_name, split_axis, concat_axis, *, tiled=False): ...
