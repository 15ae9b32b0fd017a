"""Which codec each mesh axis (and traffic kind) uses: the per-axis compression policy.

A policy maps mesh axis names to codecs, with optional overrides per traffic kind:
``grad`` (data-parallel gradient reduce), ``param`` (ZeRO parameter gather) and ``act``
(tensor/pipeline activations and their gradients). Messages under ``min_bytes`` go uncompressed.

YAML form (``configs/policy/zhybrid.yaml``)::

    name: zhybrid
    min_bytes: 65536
    axes:
      data:   {codec: zfp, rate: 8}
      tensor: {codec: zfp, rate: 16, act: "zfp:24"}   # per-kind override
      pipe:   "zfp:16"

A codec per dtype: keys ``float32``, ``bfloat16``, ``float16``, ``float64`` in an axis mapping (or
in a per-kind mapping) choose the codec for messages of that dtype; other dtypes take the entry's
``codec`` (``off`` when the mapping has none)::

    tensor: {codec: zfp, rate: 16, bfloat16: "zfp:12"}       # 16-bit floats take 12 bits/value
    data: {float32: {codec: zfp, rate: 8}, bfloat16: {codec: zfp, rate: 12}}
    pipe: {codec: zfp, rate: 16, act: {codec: zfp, rate: 24, bfloat16: "zfp:12"}}

A per-kind override replaces the axis entry for that kind, dtype keys included. A lossy codec that
would send no fewer bits per value than the raw dtype (ZFP at rate 16 on bfloat16, rate 32 on
float32) is an error naming its key: at load time for an entry's codec (against float32) and its
dtype keys, and when a collective would send such a message otherwise (e.g. ``tensor: "zfp:16"``
reached by bfloat16 activations). The presets give 16-bit floats rate 12 where float32 gets 16.

``error_feedback: true`` in an axis mapping (``data: {codec: zfp, rate: 8, error_feedback: true}``)
asks the trainer to carry error-feedback residuals for that axis' ``grad`` traffic (see
`jaxhc.psum` ``residual=``). It needs a lossy grad codec: on a lossless one the residual would stay
zero forever, so asking for it there is a configuration error rather than silent dead state.
Two more keys of the data axis shape what the trainer sends: ``keep_own: true`` (with
``error_feedback``) sums each rank's own slice of a gradient reduce-scatter uncoded, as it never
travels, and ``param_delta: true`` (with a lossy ``param`` codec) makes the ZeRO parameter
gathers send each chunk's change since the last gathered copy.

A codec entry is a spec string (``"zfp:8"``, ``"zfp:8:d3"``, ``"q8"``, ``"mpc:0.8"``, ``"none"`` =
the identity codec through jaxhc's algorithms), a mapping ``{codec: zfp|q8|q4|mpc|none, rate:,
dims: (zfp's block layout, 1..3), block:, stochastic: (q8/q4 rounding), seed:, rotate: (q8/q4:
rotated blocks, ``q4:h``), budget:, dim:}``,
or ``off`` / ``null`` for plain `jax.lax` collectives. Axes that are not listed are ``off``, but
for the sub-axes ``data.0``, ``data.1``, ... of a nested data axis (`jaxhc.parallel.amsp`), which
take the entry of ``data`` unless they have their own (e.g. a lighter codec inside a node).

``warmup_steps: N`` (with ``warmup_codec:``, a codec entry, ``q8`` unless given) makes the trainer's
first N steps send the data-axis gradients with ``warmup_codec`` instead (`Policy.warming`), the
rest of the policy unchanged; error-feedback residuals carry on across the switch, so with
``error_feedback`` the warm-up codec must be lossy too. Only the training loop switches (`jaxhc
train`); a step built directly from the policy (`make_train_step`) runs its steady codecs.

The traffic kinds, the dtype keys and the shipped presets:

>>> from jaxhc.policy import DTYPES, KINDS, PRESETS
>>> KINDS, DTYPES
(('grad', 'param', 'act'), ('float32', 'bfloat16', 'float16', 'float64'))
>>> "zhybrid" in PRESETS and jaxhc.Policy.preset("zhybrid").codec_for("data", "grad").spec
'zfp:8'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from jaxhc.codecs import Codec, Quant
from jaxhc.partition import parent_axis
from jaxhc.policy_axis import (
    DTYPES,
    FLAGS,
    KINDS,
    AxisPolicy,
    axis_policy,
    check_saving,
    codec_entry,
    spec,
)
from jaxhc.policy_axis import MPC_BUDGET as MPC_BUDGET  # the presets' MPC budget
from jaxhc.policy_presets import PRESETS
from jaxhc.schema import read_yaml, structure

__all__ = ["DTYPES", "KINDS", "PRESETS", "AxisPolicy", "Policy", "PolicyKeys"]


@dataclasses.dataclass(frozen=True)
class PolicyKeys:
    """The keys of a policy mapping (YAML): ``axes`` maps mesh axis names to codec entries
    (parsed by `Policy.from_dict`).

    >>> jaxhc.Policy.from_dict({"min_bytes": "64k"}, name="p")
    Traceback (most recent call last):
    ValueError: policy p: min_bytes='64k' must be an integer
    """

    name: Any = None
    min_bytes: int = 65536
    axes: dict[str, Any] | None = None
    warmup_steps: Any = 0
    warmup_codec: Any = "q8"


@dataclasses.dataclass(frozen=True)
class Policy:
    """Mesh axis -> codec. Hashable, so it can be a static argument of jitted functions.

    >>> from jaxhc import Policy
    >>> p = Policy.preset("mzhybrid")
    >>> p.codec_for("tensor"), p.codec_for("data", "grad")
    (Mpc(dim=1, budget=0.95), Zfp(rate=8.0, dims=1))
    """

    name: str = "custom"
    axes: tuple[tuple[str, AxisPolicy], ...] = ()
    min_bytes: int = 65536
    warmup_steps: int = 0  # the trainer's first steps send data-axis gradients with warmup_codec
    warmup_codec: Codec | None = Quant(bits=8)
    # A warm-up policy (`warming`): the data-axis codecs of the policy it warms up, whose flat
    # ZeRO layout it keeps (`data_codecs`).
    steady_codecs: tuple[Codec, ...] = ()

    def __post_init__(self):
        if isinstance(self.min_bytes, bool) or not isinstance(self.min_bytes, int):
            raise ValueError(f"policy {self.name}: min_bytes {self.min_bytes!r} must be an integer")
        if self.min_bytes < 0:
            raise ValueError(f"policy {self.name}: min_bytes {self.min_bytes} must be >= 0")
        steps = self.warmup_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"policy {self.name}: warmup_steps={steps!r} must be an integer >= 0")
        codec = self.warmup_codec
        if steps and self._asked("data", "error_feedback") and (codec is None or codec.lossless):
            raise ValueError(
                f"policy {self.name}: warmup_codec={spec(codec)!r} must be lossy (zfp, q8, q4): "
                "axes.data.error_feedback carries residuals through the warm-up"
            )

    def warming(self) -> Policy:
        """The policy of the warm-up steps: every data axis entry (``data`` and its sub-axes
        ``data.<i>``) sends ``grad`` traffic with `warmup_codec`, the rest as this policy.

        >>> p = jaxhc.Policy.from_dict({"axes": {"data": "q4:h"}, "warmup_steps": 50}, name="w")
        >>> p.warming().codec_for("data", "grad").spec, p.warming().codec_for("data", "param").spec
        ('q8', 'q4:h')
        """
        axes = []
        for axis, entry in self.axes:
            if parent_axis(axis) == "data":
                overrides = tuple(o for o in entry.overrides if o[0] != "grad")
                entry = dataclasses.replace(
                    entry,
                    overrides=(*overrides, ("grad", self.warmup_codec)),
                    dtypes=tuple(d for d in entry.dtypes if d[0] != "grad"),
                )
            axes.append((axis, entry))
        return dataclasses.replace(
            self,
            name=f"{self.name}:warmup",
            axes=tuple(axes),
            warmup_steps=0,
            steady_codecs=self.data_codecs(),
        )

    def data_codecs(self) -> tuple[Codec, ...]:
        """Every codec the float32 traffic over ``data`` and its sub-axes ``data.<i>`` may take in
        a run of this policy: the grad and param codecs, the warm-up codec while ``warmup_steps``
        > 0, and a warm-up policy's steady ones (both phases keep one flat layout).

        >>> p = jaxhc.Policy.from_dict({"axes": {"data": {"codec": "q4:h", "param": "q8:b512"}}})
        >>> [c.spec for c in p.data_codecs()], [c.spec for c in p.warming().data_codecs()]
        (['q4:h', 'q8:b512'], ['q8', 'q8:b512', 'q4:h'])
        """
        out = [self.warmup_codec] if self.warmup_steps else []
        for axis, entry in self.axes:
            if axis == "data" or axis.startswith("data."):
                out += [entry.codec_for(kind, jnp.float32) for kind in ("grad", "param")]
        return tuple(dict.fromkeys(c for c in (*out, *self.steady_codecs) if c is not None))

    def codec_for(self, axis_name, kind: str | None = None, dtype=None) -> Codec | None:
        """The codec for traffic of `kind` and `dtype` over `axis_name` (a name or a tuple).

        Without `dtype`, the entries' own codecs (their per-dtype keys aside). For a tuple of axes
        the most faithful of their codecs wins (plain lax, then the identity, MPC, then the lossy
        codecs by decreasing bits per value: ZFP's rate, q8/q4's ``bits_per_value``; at equal ZFP
        rates the larger blocks, which are more accurate), so
        compression never goes below what any axis asks.
        """
        return self._choose(axis_name, kind, dtype)[0]

    def check_saving(self, axis_name, kind: str | None, dtype) -> None:
        """One-line error naming the key when the codec chosen for `dtype` messages is lossy and
        sends no fewer bits per value than `dtype` itself (lossy for no saving)."""
        codec, key = self._choose(axis_name, kind, dtype)
        check_saving(codec, dtype, f"policy {self.name}: {key}")

    def _choose(self, axis_name, kind, dtype) -> tuple[Codec | None, str]:
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown traffic kind {kind!r}: use one of {', '.join(KINDS)}")
        names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
        chosen = []
        for a in names:
            entry, name = self._entry(a)
            codec, key = entry.choose(kind, dtype) if entry else (None, "")
            chosen.append((codec, f"axes.{name}{key}"))
        return max(chosen, key=lambda c: _fidelity(c[0])) if chosen else (None, "axes")

    def _entry(self, axis: str) -> tuple[AxisPolicy | None, str]:
        """The entry of mesh axis `axis` and its key: a sub-axis ``data.<i>`` of a nested data
        axis (`jaxhc.parallel.amsp`) without an entry of its own takes the one of ``data``."""
        table = dict(self.axes)
        if axis not in table and isinstance(axis, str):
            axis = parent_axis(axis)
        return table.get(axis), axis

    def error_feedback(self, axis_name) -> bool:
        """Whether ``grad`` traffic over `axis_name` (a name or tuple) carries error feedback: some
        listed axis asks for it and the chosen grad codec is lossy."""
        codec = self.codec_for(axis_name, "grad", jnp.float32)  # the trainer's gradients
        return self._asked(axis_name, "error_feedback") and codec is not None and not codec.lossless

    def keep_own(self, axis_name) -> bool:
        """Whether the trainer's error-feedback gradient reduce-scatters over `axis_name` add each
        rank's own slice uncoded (``keep_own: true``; only with error feedback there)."""
        return self._asked(axis_name, "keep_own") and self.error_feedback(axis_name)

    def param_delta(self, axis_name) -> bool:
        """Whether the trainer's parameter gathers over `axis_name` send each chunk's change since
        the last gathered copy (``param_delta: true``) through a lossy param codec."""
        codec = self.codec_for(axis_name, "param", jnp.float32)
        return self._asked(axis_name, "param_delta") and codec is not None and not codec.lossless

    def _asked(self, axis_name, key: str) -> bool:
        names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
        return any(getattr(e, key) for e in (self._entry(a)[0] for a in names) if e)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> Policy:
        """Build a policy from its YAML mapping; a bad entry is a ValueError naming its key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"policy {name or '?'}: expected a mapping, got {type(data).__name__}")
        name = str(data.get("name", name or "custom"))
        keys = structure(PolicyKeys, data, kind=None, where=f"policy {name}")
        parsed = tuple(
            (axis, axis_policy(entry, f"policy {name}: axes.{axis}"))
            for axis, entry in (keys.axes or {}).items()
        )
        warm = codec_entry(keys.warmup_codec, f"policy {name}: warmup_codec")
        check_saving(warm, jnp.float32, f"policy {name}: warmup_codec")
        return cls(
            name=name,
            axes=parsed,
            min_bytes=keys.min_bytes,
            warmup_steps=keys.warmup_steps,
            warmup_codec=warm,
        )

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> Policy:
        data = read_yaml(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        try:
            return cls.from_dict(data, name=stem)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def preset(cls, name: str) -> Policy:
        if name not in PRESETS:
            raise ValueError(f"unknown policy preset {name!r}: use one of {', '.join(PRESETS)}")
        return cls.from_dict(PRESETS[name], name=name)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike | Policy) -> Policy:
        """A Policy, a preset name, or a path to a policy YAML file."""
        if isinstance(name_or_path, Policy):
            return name_or_path
        text = os.fspath(name_or_path)
        if text in PRESETS:
            return cls.preset(text)
        if text.endswith((".yaml", ".yml")) or os.sep in text:
            if not os.path.exists(text):
                raise ValueError(f"policy file {text!r} does not exist")
            return cls.from_yaml(text)
        raise ValueError(
            f"unknown policy {text!r}: use a preset ({', '.join(PRESETS)}) or a YAML path"
        )

    def to_dict(self) -> dict:
        axes = {}
        for axis, ap in self.axes:
            entry = {"codec": spec(ap.codec)}
            entry.update({d: spec(c) for k, d, c in ap.dtypes if not k})
            for kind, codec in ap.overrides:
                per_dtype = {d: spec(c) for k, d, c in ap.dtypes if k == kind}
                entry[kind] = {"codec": spec(codec), **per_dtype} if per_dtype else spec(codec)
            for key in FLAGS:
                if getattr(ap, key):
                    entry[key] = True
            axes[axis] = entry
        out = {"name": self.name, "min_bytes": self.min_bytes, "axes": axes}
        if self.warmup_steps or self.warmup_codec != Quant(bits=8):
            out.update(warmup_steps=self.warmup_steps, warmup_codec=spec(self.warmup_codec))
        return out


def _fidelity(codec: Codec | None) -> float:
    return 4.0 if codec is None else codec.fidelity
