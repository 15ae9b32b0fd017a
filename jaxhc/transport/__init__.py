"""How compressed payloads (and raw fallbacks) move between ranks.

A transport provides the few collectives jaxhc's algorithms are written in: all_to_all of payload
rows, all_gather, ppermute, an all-ranks agreement on a flag, and the plain (raw) collectives used
as fallbacks. `XlaTransport` (default) uses `jax.lax` inside `shard_map`; `MpiTransport` uses
mpi4jax with one process per device (see `jaxhc.launch`).

>>> jaxhc.transport.current().name                  # outside any `use`: XLA
'xla'
"""

from jaxhc.transport._base import Transport as Transport
from jaxhc.transport._current import axis_index as axis_index
from jaxhc.transport._current import axis_size as axis_size
from jaxhc.transport._current import current as current
from jaxhc.transport._current import use as use
from jaxhc.transport.mpi import MpiTransport as MpiTransport
from jaxhc.transport.mpi import ProcessGrid as ProcessGrid
from jaxhc.transport.xla import XlaTransport as XlaTransport

__all__ = [
    "MpiTransport",
    "ProcessGrid",
    "Transport",
    "XlaTransport",
    "axis_index",
    "axis_size",
    "current",
    "use",
]
