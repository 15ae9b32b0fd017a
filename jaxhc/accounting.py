"""Traffic accounting: raw and wire bytes per mesh axis, and fallback counts, as collectives run.

Each jaxhc collective records, every time it executes on a device, the bytes a plain ring
collective would move for that rank ("raw") and the bytes its transport actually moved ("wire"),
under its mesh axis and traffic kind. A call that fell back to raw transfer counts as a fallback
(its wire bytes are then the raw bytes). Recording happens through `jax.debug.callback`, so it is
exact under jit, scan, cond and remat. It costs nothing when no `Ledger` is active: whether one is
is part of `jaxhc.context`, and so of jax's jit cache key: a function called outside every Ledger
is compiled without the callbacks, and the first call inside one compiles it again with them (one
host callback per collective per device). ``with jaxhc.accounting.disabled():`` around tracing
turns them off even inside a Ledger.

>>> from jax.sharding import Mesh, PartitionSpec as P
>>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
>>> psum = lambda g: jaxhc.psum(g, "data", codec="zfp:8")
>>> step = jax.jit(jax.shard_map(psum, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
>>> with jaxhc.accounting.Ledger() as ledger:
...     out = jax.block_until_ready(step(jnp.ones((2, 1024))))
>>> ledger.per_axis(devices=2)          # per rank: 4 KiB raw, a quarter of it (and a flag) sent
{'data': {'raw_bytes': 4096.0, 'wire_bytes': 1032.0, 'fallbacks': 0.0, 'calls': 1.0}}
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import defaultdict

import jax

from jaxhc import context

__all__ = ["Ledger", "Tally", "captured", "disabled", "enabled", "record"]

_LOCK = threading.Lock()
_ACTIVE: list[Ledger] = []


@dataclasses.dataclass
class Tally:
    """The traffic of one mesh axis and kind: bytes and counts summed over executions.

    >>> jaxhc.accounting.Tally()
    Tally(raw_bytes=0.0, wire_bytes=0.0, fallbacks=0.0, calls=0.0)
    """

    raw_bytes: float = 0.0
    wire_bytes: float = 0.0
    fallbacks: float = 0.0
    calls: float = 0.0


class Ledger:
    """Accumulates traffic of the collectives that execute while it is active (a context manager).

    Totals are summed over devices; `per_axis(devices=N)` divides by the devices that ran the
    program to give per-rank numbers.

    >>> with jaxhc.accounting.Ledger() as ledger:
    ...     jaxhc.accounting.record("data", "grad", 4096.0, 1024.0)   # what a collective does
    >>> ledger.per_axis(by_kind=True)
    {'data/grad': {'raw_bytes': 4096.0, 'wire_bytes': 1024.0, 'fallbacks': 0.0, 'calls': 1.0}}
    """

    def __init__(self):
        self._tallies: dict[tuple[str, str], Tally] = defaultdict(Tally)
        self._entered: list = []

    def __enter__(self) -> Ledger:
        with _LOCK:
            _ACTIVE.append(self)
        entered = context._replaced(ledger=True)
        entered.__enter__()
        self._entered.append(entered)
        return self

    def __exit__(self, *exc) -> None:
        self._entered.pop().__exit__(*exc)
        with _LOCK:
            _ACTIVE.remove(self)

    def add(self, axis: str, kind: str, raw: float, wire: float, fallback: bool) -> None:
        with _LOCK:
            t = self._tallies[(axis, kind)]
            t.raw_bytes += raw
            t.wire_bytes += wire
            t.fallbacks += float(fallback)
            t.calls += 1.0

    def reset(self) -> None:
        with _LOCK:
            self._tallies.clear()

    def per_axis(self, devices: int = 1, by_kind: bool = False) -> dict[str, dict[str, float]]:
        """{axis (or "axis/kind"): {raw_bytes, wire_bytes, fallbacks, calls}} per device."""
        out: dict[str, Tally] = defaultdict(Tally)
        with _LOCK:
            for (axis, kind), t in self._tallies.items():
                o = out[f"{axis}/{kind}" if by_kind else axis]
                o.raw_bytes += t.raw_bytes
                o.wire_bytes += t.wire_bytes
                o.fallbacks += t.fallbacks
                o.calls += t.calls
        return {
            k: {f.name: getattr(t, f.name) / devices for f in dataclasses.fields(t)}
            for k, t in sorted(out.items())
        }


def _dispatch(axis: str, kind: str, raw: float, wire: float, fallback: bool) -> None:
    with _LOCK:
        active = list(_ACTIVE)
    for ledger in active:
        ledger.add(axis, kind, raw, wire, fallback)


def enabled() -> bool:
    """Whether collectives traced now record their traffic (a Ledger is active, not disabled).

    >>> jaxhc.accounting.enabled()
    False
    >>> with jaxhc.accounting.Ledger():
    ...     jaxhc.accounting.enabled()
    True
    """
    return context.recording()


@contextlib.contextmanager
def disabled():
    """Trace collectives without accounting callbacks (for speed on accelerators).

    >>> with jaxhc.accounting.Ledger(), jaxhc.accounting.disabled():
    ...     jaxhc.accounting.enabled()
    False
    """
    with context._replaced(callbacks=False):
        yield


_CAPTURES: list[list] = []  # `captured`'s lists, innermost last (tracing is single-threaded)


@contextlib.contextmanager
def captured():
    """Also collect, as ``(axis_name, kind, raw, wire, fallback)``, the executions that
    collectives traced inside record (nothing when accounting is off). For a computation that
    runs again where jax does not replay callbacks (`jax.checkpoint`'s recomputation in the
    backward): its caller records them there once more with `record`.

    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    >>> f = jax.shard_map(lambda g: jaxhc.psum(g, "data"), mesh=mesh, in_specs=P("data"),
    ...                   out_specs=P("data"))
    >>> with jaxhc.accounting.Ledger(), jaxhc.accounting.captured() as calls:
    ...     _ = jax.make_jaxpr(f)(jnp.ones((2, 1024)))
    >>> calls                               # (axis, kind, raw, wire, fallback)
    [('data', None, 4096.0, 4096.0, False)]
    """
    calls: list = []
    _CAPTURES.append(calls)
    try:
        yield calls
    finally:
        _CAPTURES.remove(calls)


def record(axis_name, kind: str | None, raw: float, wire, fallback=False, anchor=None) -> None:
    """Called by collectives while tracing: emits a callback that tallies one execution.

    `raw` is known when tracing; `wire` and `fallback` may be too (floats, bools) or be traced
    values that the transport reports at run time (the fused MPI collectives). `anchor` (the
    collective's result) makes the callback depend on data the collective produced: without it,
    JAX hoists the callback out of a `lax.scan` under `jax.grad` as loop-invariant, and it would
    run once instead of once per iteration.

    >>> with jaxhc.accounting.Ledger() as ledger:
    ...     jaxhc.accounting.record("tensor", "act", 2048.0, 2048.0, fallback=True)
    >>> ledger.per_axis()["tensor"]["fallbacks"]
    1.0
    """
    if not enabled():
        return
    if _CAPTURES:
        _CAPTURES[-1].append((axis_name, kind, raw, wire, fallback))
    axis = ",".join(axis_name) if isinstance(axis_name, (tuple, list)) else str(axis_name)
    args = (anchor.reshape(-1)[:1],) if anchor is not None and anchor.size else ()
    kind = kind or "other"
    if isinstance(wire, jax.Array) or isinstance(fallback, jax.Array):
        jax.debug.callback(
            lambda w, f, *_: _dispatch(axis, kind, float(raw), float(w), bool(f)),
            wire,
            fallback,
            *args,
        )
        return
    jax.debug.callback(
        lambda *_: _dispatch(axis, kind, float(raw), float(wire), bool(fallback)), *args
    )
