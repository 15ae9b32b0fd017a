"""Loads the compiled FFI modules and registers their handlers with XLA (once, at import)."""

from __future__ import annotations

import jax

try:
    from jaxhc import _jaxhc_cpu as cpu
except ImportError as e:  # pragma: no cover - only on a broken install
    raise ImportError(
        "jaxhc's native module _jaxhc_cpu is not built; run `make setup` "
        "(or `pip install .`) in the jaxhc checkout"
    ) from e

try:
    from jaxhc import _jaxhc_cuda as cuda
except ImportError:
    cuda = None

try:  # built where an MPI library was found (the fused collectives of the MPI transport)
    from jaxhc import _jaxhc_mpi as mpi
except ImportError:
    mpi = None

# Reads (once) and checks JAXHC_THREADS: a bad value is an error here, not in a handler.
cpu.threads()

for _name, _capsule in cpu.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
if mpi is not None:
    for _name, _capsule in mpi.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")
if cuda is not None:
    for _name, _capsule in cuda.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")

__all__ = ["cpu", "cuda", "mpi"]
