"""Codec spec strings: "none", "zfp:8", "zfp:12.5", "zfp:8:d3", "mpc", "mpc:0.8", "mpc:0.8:dim=2",
"q8", "q4", "q8:b128", "q8:sr", "q4:b128:sr7", "q4:h", "q8:b512:h"."""

from __future__ import annotations

from collections.abc import Mapping

from jaxhc.codecs._base import Codec
from jaxhc.codecs._identity import Identity
from jaxhc.codecs._mpc import Mpc
from jaxhc.codecs._quant import Quant, parse_quant
from jaxhc.codecs._zfp import Zfp
from jaxhc.schema import structure

CodecLike = Codec | str | None

# The spec forms `parse` takes, one per codec family (what error messages and --help list).
SPEC_FORMS: dict[str, str] = {
    "none": "none",
    "zfp": "zfp:<rate>[:d2|:d3]",
    "mpc": "mpc[:<budget>][:dim=<d>]",
    "q8": "q8[:b<block>][:sr[<seed>]|:h]",
    "q4": "q4[:b<block>][:sr[<seed>]|:h]",
}


# A codec as a mapping of its fields (a policy's ``{codec: zfp, rate: 8}``), per name: its class,
# the codec whose values the fields left out take (None: the class's defaults) and the fields its
# name fixes (q8's and q4's bits).
FIELD_FORMS: dict[str, tuple[type[Codec], Codec | None, tuple[str, ...]]] = {
    "zfp": (Zfp, None, ()),
    "q8": (Quant, Quant(bits=8), ("bits",)),
    "q4": (Quant, Quant(bits=4), ("bits",)),
    "mpc": (Mpc, None, ()),
    "none": (Identity, None, ()),
}


def from_fields(name: str, fields: Mapping, where: str, base: Codec | None = None) -> Codec:
    """The codec `name` (a key of `FIELD_FORMS`) with `fields`; `base`, when given, replaces the
    form's codec whose values the fields left out take. A bad or unknown field is one ValueError
    line starting with `where` (its ``__post_init__`` checks: with `where`.codec).

    >>> from jaxhc.codecs import from_fields
    >>> from_fields("zfp", {"rate": 8, "dims": 3}, "policy p: axes.data")
    Zfp(rate=8.0, dims=3)
    >>> from_fields("q8", {"bits": 4}, "policy p: axes.data")
    Traceback (most recent call last):
    ValueError: policy p: axes.data: unknown key 'bits'
    """
    cls, default, fixed = FIELD_FORMS[name]
    for key in fixed:
        if key in fields:
            raise ValueError(f"{where}: unknown key {key!r}")
    base = default if base is None else base
    return structure(cls, fields, kind=None, where=where, base=base, checks=f"{where}.codec")


def parse(spec: CodecLike) -> Codec | None:
    """Turn a spec string into a codec; a Codec passes through, None stays None (plain lax).

    >>> from jaxhc.codecs import parse
    >>> parse("zfp:8"), parse("zfp:8:d3"), parse("mpc:0.8")
    (Zfp(rate=8.0, dims=1), Zfp(rate=8.0, dims=3), Mpc(dim=1, budget=0.8))
    >>> parse("none"), parse("q8:b128:sr")
    (Identity(), Quant(bits=8, block=128, stochastic=True, seed=0, rotate=False))
    """
    if spec is None or isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"codec spec {spec!r} must be a string such as 'zfp:8', 'mpc' or 'none'")
    text = spec.strip().lower()
    name, _, rest = text.partition(":")
    args = [a for a in rest.split(":")] if rest else []
    try:
        if name in ("none", "identity", "raw") and not args:
            return Identity()
        if name == "zfp" and len(args) in (1, 2):
            dims = 1
            if len(args) == 2:
                if args[1] not in ("d1", "d2", "d3"):
                    raise ValueError(f"{args[1]!r} is not a block layout d1, d2 or d3")
                dims = int(args[1][1])
            return Zfp(rate=float(args[0]), dims=dims)
        if name == "mpc" and len(args) <= 2:
            budget, dim = None, 1
            for a in args:
                if a.startswith("dim="):
                    dim = int(a[4:])
                else:
                    budget = float(a)
            return Mpc(dim=dim, budget=budget)
        if name in ("q8", "q4"):
            return parse_quant(name, args)
    except ValueError as e:
        raise ValueError(f"bad codec spec {spec!r}: {e}") from None
    forms = [f"'{form}'" for form in SPEC_FORMS.values()]
    raise ValueError(f"bad codec spec {spec!r}: use {', '.join(forms[:-1])} or {forms[-1]}")
