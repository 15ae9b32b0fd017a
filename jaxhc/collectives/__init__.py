"""Compressed collectives with `jax.lax` signatures plus ``codec=`` / ``policy=`` and ``kind=``.

Without ``codec=`` or ``policy=`` a collective takes the policy of `jaxhc.context`.
"""

from jaxhc.collectives._common import resolve as resolve_codec
from jaxhc.collectives.all_gather import all_gather as all_gather
from jaxhc.collectives.all_to_all import all_to_all as all_to_all
from jaxhc.collectives.pmean import pmean as pmean
from jaxhc.collectives.ppermute import ppermute as ppermute
from jaxhc.collectives.psum import psum as psum
from jaxhc.collectives.psum_pair import psum_pair as psum_pair
from jaxhc.collectives.psum_scatter import psum_scatter as psum_scatter

__all__ = [
    "all_gather",
    "all_to_all",
    "pmean",
    "ppermute",
    "psum",
    "psum_pair",
    "psum_scatter",
    "resolve_codec",
]
