"""The shipped policies (``jaxhc.Policy.preset(name)``), as their YAML mappings."""

from __future__ import annotations

from jaxhc.policy_axis import MPC_BUDGET


def _all(codec) -> dict:
    return {"axes": {"data": codec, "tensor": codec, "pipe": codec}}


# ZFP at rate 16 saves nothing on 16-bit floats: the presets give them rate 12 (1.33x).
_ZFP16 = {"codec": "zfp", "rate": 16, "bfloat16": "zfp:12", "float16": "zfp:12"}

PRESETS: dict[str, dict] = {
    "none": {"axes": {}},
    "identity": _all("none"),
    "zfp8": _all("zfp:8"),
    "zfp16": _all(_ZFP16),
    "mpc": _all(f"mpc:{MPC_BUDGET}"),
    "mzhybrid": {
        "axes": {"data": "zfp:8", "tensor": f"mpc:{MPC_BUDGET}", "pipe": f"mpc:{MPC_BUDGET}"}
    },
    "zhybrid": {"axes": {"data": "zfp:8", "tensor": _ZFP16, "pipe": _ZFP16}},
    "qhybrid": {"axes": {"data": "q8", "tensor": f"mpc:{MPC_BUDGET}", "pipe": f"mpc:{MPC_BUDGET}"}},
    "q8": _all("q8"),
}
# The hybrids with error feedback on the data-parallel gradients, their ZFP in 3-D blocks (64
# values per exponent): the same bits as 1-D, ~3x less error on gradients and activations; over
# three seeds it took the hybrids' loss gap to none within 0.5 % (docs/benchmarks.md, the sweep).
_EF = {"codec": "zfp", "rate": 8, "dims": 3, "error_feedback": True}
_ZFP16_D3 = {"codec": "zfp", "rate": 16, "dims": 3, "bfloat16": "zfp:12:d3", "float16": "zfp:12:d3"}
PRESETS["mzhybrid_ef"] = {"axes": {**PRESETS["mzhybrid"]["axes"], "data": _EF}}
PRESETS["zhybrid_ef"] = {"axes": {"data": _EF, "tensor": _ZFP16_D3, "pipe": _ZFP16_D3}}
PRESETS["zfp8_ef"] = {  # zfp8 as the seed measured it (1-D), with error feedback on data
    "axes": {**PRESETS["zfp8"]["axes"], "data": {"codec": "zfp", "rate": 8, "error_feedback": True}}
}
PRESETS["q8_ef"] = {
    "axes": {**PRESETS["q8"]["axes"], "data": {"codec": "q8", "error_feedback": True}}
}
# 4 bits per gradient value: rotated q4 with error feedback on the data gradients, the parameter
# gathers (ZeRO) in q8, lossless MPC for the model-parallel traffic.
PRESETS["q4_ef"] = {
    "axes": {
        "data": {"codec": "q4:h", "error_feedback": True, "param": "q8"},
        "tensor": f"mpc:{MPC_BUDGET}",
        "pipe": f"mpc:{MPC_BUDGET}",
    }
}
# q4_ef with every data-axis message in 4 bits: gradients and parameter gathers rotated in blocks
# of 1024 values (under ZeRO the gathers are half the data axis' bytes; in q8 they alone are
# 0.128 of uncompressed training's).
PRESETS["q4_ef4"] = {
    "axes": {
        "data": {"codec": "q4:b1024:h", "error_feedback": True, "param": "q4:b1024:h"},
        "tensor": f"mpc:{MPC_BUDGET}",
        "pipe": f"mpc:{MPC_BUDGET}",
    }
}
