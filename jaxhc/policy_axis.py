"""One mesh axis' entry of a `jaxhc.policy.Policy`: `AxisPolicy` and its YAML form.

An axis entry is a codec entry (a spec string, a mapping of a codec's fields, or ``off``) with
optional per-kind overrides (``grad``, ``param``, ``act``), per-dtype codecs and the flags
``error_feedback``, ``keep_own`` and ``param_delta``; `axis_policy` parses and checks one, a bad
key a ValueError naming it (the YAML grammar is described in `jaxhc.policy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from jaxhc.codecs import FIELD_FORMS, Codec, from_fields, parse
from jaxhc.schema import structure

KINDS = ("grad", "param", "act")
DTYPES = ("float32", "bfloat16", "float16", "float64")  # the keys of per-dtype codec entries
MPC_BUDGET = 0.95  # the budget of MPC mapping entries ({codec: mpc}) and of the presets
# Values a lossy codec's bits per value are measured on (large: padding does not count).
_SAMPLE = 1 << 20


@dataclasses.dataclass(frozen=True)
class AxisPolicy:
    """The codec of one mesh axis (None: plain lax) and its per-kind overrides.

    >>> data = dict(jaxhc.Policy.preset("q4_ef").axes)["data"]
    >>> data.codec_for("grad").spec, data.codec_for("param").spec, data.error_feedback
    ('q4:h', 'q8', True)
    """

    codec: Codec | None
    overrides: tuple[tuple[str, Codec | None], ...] = ()
    error_feedback: bool = False  # carry residuals of this axis' lossy grad traffic
    keep_own: bool = False  # a rank's own slice of a grad reduce-scatter is summed uncoded
    param_delta: bool = False  # param gathers send the change since the last gathered copy
    # Per-dtype codecs: (kind, or "" for the axis entry; dtype name; codec).
    dtypes: tuple[tuple[str, str, Codec | None], ...] = ()

    def codec_for(self, kind: str | None, dtype=None) -> Codec | None:
        return self.choose(kind, dtype)[0]

    def choose(self, kind: str | None, dtype=None) -> tuple[Codec | None, str]:
        """(codec, the key that chose it relative to the axis: "", ".act", ".bfloat16", ...)."""
        kinds = dict(self.overrides)
        scope = kind if kind in kinds else ""  # a kind override replaces the whole axis entry
        if dtype is not None:
            name = jnp.dtype(dtype).name
            for k, d, codec in self.dtypes:
                if (k, d) == (scope, name):
                    return codec, f"{'.' + k if k else ''}.{d}"
        return (kinds[kind], f".{kind}") if scope else (self.codec, "")


def codec_entry(entry: Any, where: str) -> Codec | None:
    """A codec entry's codec: a spec string or `Codec` (parsed), a mapping of a codec's fields
    (``{codec: zfp, rate: 8}``), or ``off``/``null``/``false`` (None: plain lax). A bad entry is
    a ValueError starting with `where`."""
    if entry is None or entry is False or (isinstance(entry, str) and entry.lower() == "off"):
        return None
    if isinstance(entry, (str, Codec)):
        try:
            return parse(entry)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if isinstance(entry, Mapping):
        entry = dict(entry)
        kind = str(entry.pop("codec", "")).lower()
        if ":" in kind:  # {codec: "zfp:8"} (plus per-kind overrides, popped by the caller)
            structure(_NoKeys, entry, kind=None, where=where)
            return codec_entry(kind, where)
        if kind in ("off", "lax"):
            structure(_NoKeys, entry, kind=None, where=where, checks=f"{where}.codec")
            return None
        if kind not in FIELD_FORMS:
            raise ValueError(
                f"{where}.codec: unknown codec {kind!r}: use {', '.join(FIELD_FORMS)} or off"
            )
        # MPC's budget, static in a policy (`MPC_BUDGET` unless given; the spec "mpc" has none)
        base = parse(f"mpc:{MPC_BUDGET}") if kind == "mpc" else None
        return from_fields(kind, entry, where, base)
    raise ValueError(f"{where}: expected a codec spec or mapping, got {entry!r}")


@dataclasses.dataclass(frozen=True)
class _NoKeys:
    """A codec mapping that takes no keys besides ``codec`` (``off``, or a spec string)."""


def _entry(entry: Any, where: str) -> tuple[Codec | None, list[tuple[str, Codec | None]]]:
    """An entry's codec and its per-dtype codecs (a mapping with dtype keys and no codec keys
    is ``off`` for the other dtypes). Lossy codecs that save nothing are refused here."""
    per_dtype = []
    if isinstance(entry, Mapping):
        entry = dict(entry)
        for dtype in DTYPES:
            if dtype in entry:
                codec = codec_entry(entry.pop(dtype), f"{where}.{dtype}")
                check_saving(codec, dtype, f"{where}.{dtype}")
                per_dtype.append((dtype, codec))
        if per_dtype and not entry:
            return None, per_dtype
    codec = codec_entry(entry, where)
    check_saving(codec, jnp.float32, where)
    return codec, per_dtype


def check_saving(codec: Codec | None, dtype, where: str) -> None:
    """A ValueError naming `where` when `codec` is lossy and sends no fewer bits per `dtype` value
    than `dtype` itself."""
    if codec is None or codec.lossless or not codec.supports(dtype):
        return
    dtype = jnp.dtype(dtype)
    try:
        bits = codec.payload_bytes(_SAMPLE, dtype) * 8 / _SAMPLE
    except ValueError as e:  # e.g. a ZFP rate out of the dtype's range
        raise ValueError(f"{where}: {e}") from None
    if bits >= 8 * dtype.itemsize:
        raise ValueError(
            f"{where}: lossy {codec.spec} sends {bits:g} bits per {dtype.name} value, no fewer "
            f"than raw {dtype.name} ({8 * dtype.itemsize}): choose fewer bits for {dtype.name} "
            f"(a '{dtype.name}:' key, e.g. zfp:{8 * dtype.itemsize * 3 // 4})"
        )


def axis_policy(entry: Any, where: str) -> AxisPolicy:
    """Parse and check one axis entry of a policy mapping (`where` names it in errors)."""
    overrides, dtypes, flags = [], [], dict.fromkeys(FLAGS, False)
    if isinstance(entry, Mapping):
        entry = dict(entry)
        for key in FLAGS:
            flags[key] = entry.pop(key, False)
            if not isinstance(flags[key], bool):
                raise ValueError(f"{where}.{key}: expected true or false, got {flags[key]!r}")
        for kind in KINDS:
            if kind in entry:
                codec, per_dtype = _entry(entry.pop(kind), f"{where}.{kind}")
                overrides.append((kind, codec))
                dtypes += [(kind, d, c) for d, c in per_dtype]
        for key in list(entry):
            if key in ("params", "grads", "acts"):
                raise ValueError(
                    f"{where}: unknown key {key!r} (traffic kinds are {', '.join(KINDS)})"
                )
    codec, per_dtype = _entry(entry, where)
    dtypes = [("", d, c) for d, c in per_dtype] + dtypes
    axis = AxisPolicy(codec, tuple(overrides), dtypes=tuple(dtypes), **flags)
    for key, kind in (("error_feedback", "grad"), ("param_delta", "param")):
        chosen = axis.codec_for(kind, jnp.float32)
        if flags[key] and (chosen is None or chosen.lossless):
            raise ValueError(
                f"{where}.{key}: needs a lossy {kind} codec (zfp, q8, q4), not {spec(chosen)!r}"
            )
    if flags["keep_own"] and not flags["error_feedback"]:
        raise ValueError(f"{where}.keep_own: needs error_feedback: true on the same axis")
    return axis


FLAGS = ("error_feedback", "keep_own", "param_delta")  # the boolean keys of an axis entry


def spec(codec: Codec | None) -> str:
    """A codec's spec string as a policy mapping writes it (``off`` for plain lax)."""
    return "off" if codec is None else codec.spec
