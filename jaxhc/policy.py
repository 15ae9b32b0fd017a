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

``error_feedback: true`` in an axis mapping (``data: {codec: zfp, rate: 8, error_feedback: true}``)
asks the trainer to carry error-feedback residuals for that axis' ``grad`` traffic (see
`jaxhc.psum` ``residual=``). It needs a lossy grad codec: on a lossless one the residual would stay
zero forever, so asking for it there is a configuration error rather than silent dead state.

A codec entry is a spec string (``"zfp:8"``, ``"zfp:8:d3"``, ``"q8"``, ``"mpc:0.8"``, ``"none"`` =
the identity codec through jaxhc's algorithms), a mapping ``{codec: zfp|q8|q4|mpc|none, rate:,
dims: (zfp's block layout, 1..3), block:, stochastic: (q8/q4 rounding), seed:, budget:, dim:}``,
or ``off`` / ``null`` for plain `jax.lax` collectives. Axes that are not listed are ``off``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import yaml

from jaxhc.codecs import Codec, Identity, Mpc, Quant, Zfp, parse

__all__ = ["KINDS", "PRESETS", "AxisPolicy", "Policy"]

KINDS = ("grad", "param", "act")
MPC_BUDGET = 0.95


@dataclasses.dataclass(frozen=True)
class AxisPolicy:
    """The codec of one mesh axis (None: plain lax) and its per-kind overrides."""

    codec: Codec | None
    overrides: tuple[tuple[str, Codec | None], ...] = ()
    error_feedback: bool = False  # carry residuals of this axis' lossy grad traffic

    def codec_for(self, kind: str | None) -> Codec | None:
        return dict(self.overrides).get(kind, self.codec) if kind else self.codec


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

    def __post_init__(self):
        if isinstance(self.min_bytes, bool) or not isinstance(self.min_bytes, int):
            raise ValueError(f"policy {self.name}: min_bytes {self.min_bytes!r} must be an integer")
        if self.min_bytes < 0:
            raise ValueError(f"policy {self.name}: min_bytes {self.min_bytes} must be >= 0")

    def codec_for(self, axis_name, kind: str | None = None) -> Codec | None:
        """The codec for traffic of `kind` over `axis_name` (a name or a tuple of names).

        For a tuple of axes the most faithful of their codecs wins (plain lax, then the identity,
        MPC, then the lossy codecs by decreasing bits per value: ZFP's rate, q8/q4's
        ``bits_per_value``; at equal ZFP rates the larger blocks, which are more accurate), so
        compression never goes below what any axis asks.
        """
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown traffic kind {kind!r}: use one of {', '.join(KINDS)}")
        names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
        table = dict(self.axes)
        codecs = [table[a].codec_for(kind) if a in table else None for a in names]
        return max(codecs, key=_fidelity) if codecs else None

    def error_feedback(self, axis_name) -> bool:
        """Whether ``grad`` traffic over `axis_name` (a name or tuple) carries error feedback: some
        listed axis asks for it and the chosen grad codec is lossy."""
        names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
        table = dict(self.axes)
        asked = any(table[a].error_feedback for a in names if a in table)
        codec = self.codec_for(axis_name, "grad")
        return asked and codec is not None and not codec.lossless

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, name: str | None = None) -> Policy:
        """Build a policy from its YAML mapping; a bad entry is a ValueError naming its key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"policy {name or '?'}: expected a mapping, got {type(data).__name__}")
        name = str(data.get("name", name or "custom"))
        unknown = set(data) - {"name", "min_bytes", "axes"}
        if unknown:
            raise ValueError(f"policy {name}: unknown key {sorted(unknown)[0]!r}")
        axes = data.get("axes") or {}
        if not isinstance(axes, Mapping):
            raise ValueError(f"policy {name}: 'axes' must map axis names to codecs")
        parsed = tuple(
            (str(axis), _axis_policy(entry, f"policy {name}: axes.{axis}"))
            for axis, entry in axes.items()
        )
        return cls(name=name, axes=parsed, min_bytes=data.get("min_bytes", 65536))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> Policy:
        with open(path) as f:
            data = yaml.safe_load(f)
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
            entry = {"codec": _spec(ap.codec)}
            entry.update({k: _spec(c) for k, c in ap.overrides})
            if ap.error_feedback:
                entry["error_feedback"] = True
            axes[axis] = entry
        return {"name": self.name, "min_bytes": self.min_bytes, "axes": axes}


def _fidelity(codec: Codec | None) -> float:
    if codec is None:
        return 4.0
    if isinstance(codec, Identity):
        return 3.0
    if isinstance(codec, Mpc):
        return 2.0
    if isinstance(codec, Zfp):
        return 1.0 + codec.rate / 1000.0 + codec.dims / 1e6
    if isinstance(codec, Quant):
        return 1.0 + codec.bits_per_value / 1000.0
    return 0.0


def _codec(entry: Any, where: str) -> Codec | None:
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
            if entry:
                raise ValueError(f"{where}: unknown key {sorted(entry)[0]!r}")
            return _codec(kind, where)
        try:
            if kind in ("off", "lax"):
                codec = None
            elif kind == "none":
                codec = Identity()
            elif kind == "zfp":
                if "rate" not in entry:
                    raise ValueError("zfp needs a 'rate'")
                codec = Zfp(rate=entry.pop("rate"), dims=entry.pop("dims", 1))
            elif kind in ("q8", "q4"):
                codec = Quant(
                    bits=int(kind[1:]),
                    block=entry.pop("block", 256),
                    stochastic=entry.pop("stochastic", False),
                    seed=entry.pop("seed", 0),
                )
            elif kind == "mpc":
                codec = Mpc(dim=entry.pop("dim", 1), budget=entry.pop("budget", MPC_BUDGET))
            else:
                raise ValueError(f"unknown codec {kind!r}: use zfp, q8, q4, mpc, none or off")
        except ValueError as e:
            raise ValueError(f"{where}.codec: {e}") from None
        if entry:
            raise ValueError(f"{where}: unknown key {sorted(entry)[0]!r}")
        return codec
    raise ValueError(f"{where}: expected a codec spec or mapping, got {entry!r}")


def _axis_policy(entry: Any, where: str) -> AxisPolicy:
    overrides, feedback = [], False
    if isinstance(entry, Mapping):
        entry = dict(entry)
        feedback = entry.pop("error_feedback", False)
        if not isinstance(feedback, bool):
            raise ValueError(f"{where}.error_feedback: expected true or false, got {feedback!r}")
        for kind in KINDS:
            if kind in entry:
                overrides.append((kind, _codec(entry.pop(kind), f"{where}.{kind}")))
        for key in list(entry):
            if key in ("params", "grads", "acts"):
                raise ValueError(
                    f"{where}: unknown key {key!r} (traffic kinds are {', '.join(KINDS)})"
                )
    axis = AxisPolicy(_codec(entry, where), tuple(overrides), error_feedback=feedback)
    grad = axis.codec_for("grad")
    if feedback and (grad is None or grad.lossless):
        raise ValueError(
            f"{where}.error_feedback: needs a lossy grad codec (zfp, q8, q4), not {_spec(grad)!r}"
        )
    return axis


def _spec(codec: Codec | None) -> str:
    return "off" if codec is None else codec.spec


def _all(codec: str) -> dict:
    return {"axes": {"data": codec, "tensor": codec, "pipe": codec}}


PRESETS: dict[str, dict] = {
    "none": {"axes": {}},
    "identity": _all("none"),
    "zfp8": _all("zfp:8"),
    "zfp16": _all("zfp:16"),
    "mpc": _all(f"mpc:{MPC_BUDGET}"),
    "mzhybrid": {
        "axes": {"data": "zfp:8", "tensor": f"mpc:{MPC_BUDGET}", "pipe": f"mpc:{MPC_BUDGET}"}
    },
    "zhybrid": {"axes": {"data": "zfp:8", "tensor": "zfp:16", "pipe": "zfp:16"}},
    "qhybrid": {"axes": {"data": "q8", "tensor": f"mpc:{MPC_BUDGET}", "pipe": f"mpc:{MPC_BUDGET}"}},
}
# The hybrids with error feedback on the data-parallel gradients.
_EF = {"codec": "zfp", "rate": 8, "error_feedback": True}
PRESETS["mzhybrid_ef"] = {"axes": {**PRESETS["mzhybrid"]["axes"], "data": _EF}}
PRESETS["zhybrid_ef"] = {"axes": {**PRESETS["zhybrid"]["axes"], "data": _EF}}
