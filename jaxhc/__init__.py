"""jaxhc: compressed collectives (ZFP, MPC) for JAX/XLA training of GPT-style models.

>>> from jax.sharding import Mesh, PartitionSpec as P
>>> mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
>>> f = jax.shard_map(lambda g: jaxhc.psum(g, "data", codec="zfp:16"), mesh=mesh,
...                   in_specs=P("data"), out_specs=P("data"))
>>> jax.jit(f)(jnp.ones((2, 4)))
Array([[2., 2., 2., 2.],
       [2., 2., 2., 2.]], dtype=float32)
"""

from jaxhc import accounting as accounting
from jaxhc import codecs as codecs
from jaxhc import context as context
from jaxhc import launch as launch
from jaxhc import transport as transport
from jaxhc.collectives import all_gather as all_gather
from jaxhc.collectives import all_to_all as all_to_all
from jaxhc.collectives import pmean as pmean
from jaxhc.collectives import ppermute as ppermute
from jaxhc.collectives import psum as psum
from jaxhc.collectives import psum_pair as psum_pair
from jaxhc.collectives import psum_scatter as psum_scatter
from jaxhc.launch import Launcher as Launcher
from jaxhc.launch import run as run
from jaxhc.policy import Policy as Policy
from jaxhc.transport import axis_index as axis_index
from jaxhc.transport import axis_size as axis_size

__version__ = "0.1.0"

__all__ = [
    "Launcher",
    "Policy",
    "accounting",
    "all_gather",
    "all_to_all",
    "axis_index",
    "axis_size",
    "codecs",
    "context",
    "launch",
    "pmean",
    "ppermute",
    "psum",
    "psum_pair",
    "psum_scatter",
    "run",
    "transport",
]
