"""Codecs for compressed collectives: lossy fixed-rate ZFP, lossy block quantization (q8/q4),
lossless MPC, and the identity.

Every codec compresses the flattened array into a payload whose size is static (it depends on the
element count and dtype only), so encode and decode are XLA FFI custom calls usable under `jit`,
`vmap` and inside `shard_map`.

Wherever jaxhc takes a codec it takes a `CodecLike`: a codec, a spec string in one of the forms
of `SPEC_FORMS`, or None (the plain collective).

>>> from jaxhc.codecs import SPEC_FORMS, parse
>>> list(SPEC_FORMS)
['none', 'zfp', 'mpc', 'q8', 'q4']
>>> parse("q4:h"), parse(None)                # CodecLike in, codec (or None) out
(Quant(bits=4, block=256, stochastic=False, seed=0, rotate=True), None)

A policy may give a codec as a mapping of its fields instead (`from_fields`), by the names of
`FIELD_FORMS`:

>>> from jaxhc.codecs import FIELD_FORMS, from_fields
>>> list(FIELD_FORMS), from_fields("q8", {"block": 128}, "axes.data").spec
(['zfp', 'q8', 'q4', 'mpc', 'none'], 'q8:b128')
"""

from jaxhc.codecs._base import Codec as Codec
from jaxhc.codecs._base import Encoded as Encoded
from jaxhc.codecs._base import NativeCall as NativeCall
from jaxhc.codecs._identity import Identity as Identity
from jaxhc.codecs._mpc import Mpc as Mpc
from jaxhc.codecs._quant import Quant as Quant
from jaxhc.codecs._spec import FIELD_FORMS as FIELD_FORMS
from jaxhc.codecs._spec import SPEC_FORMS as SPEC_FORMS
from jaxhc.codecs._spec import CodecLike as CodecLike
from jaxhc.codecs._spec import from_fields as from_fields
from jaxhc.codecs._spec import parse as parse
from jaxhc.codecs._zfp import Zfp as Zfp

__all__ = [
    "Codec",
    "CodecLike",
    "Encoded",
    "FIELD_FORMS",
    "Identity",
    "Mpc",
    "NativeCall",
    "Quant",
    "SPEC_FORMS",
    "Zfp",
    "from_fields",
    "parse",
]
