"""A numpy oracle of the q8/q4 block quantizer (the rule of ffi/core/quant.h, written again).

Per block of `block` values: absmax over |x| as bits; a block whose absmax is not finite or below
2^-100 is a zero block; else scale = absmax / Q, inv = Q / absmax (float32, correctly rounded),
code = rint(x * inv) (half to even), decoded value = code * scale, rounded to the output type.
Payload: float32 scales, then int8 codes (8 bits) or two's-complement nibbles, low nibble first
(4 bits), zero-padded to a multiple of 8 bytes.

Stochastic rounding: y = x * inv; code 0 for a subnormal x or |y| < 2^-24, else floor(y) + 1
when draw < (y - floor(y)) * 2^24, else floor(y), clamped to [-Q, Q]; draw = 24 bits of
mix32(mix32(i_lo ^ mix32(i_hi ^ seed)) ^ bits(x)) (i: the value's index in the row).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import hadamard

TINY_BITS = 27 << 23  # 2^-100
INF_BITS = 0x7F800000


def qmax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def payload_bytes(n: int, bits: int, block: int) -> int:
    blocks = -(-n // block)
    return -(-(4 * blocks + -(-n * bits // 8)) // 8) * 8


def mix32(h: np.ndarray) -> np.ndarray:
    h = h.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x7FEB352D)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x846CA68B)
    return h ^ (h >> np.uint32(16))


def draws(seed: int, n: int, x32: np.ndarray) -> np.ndarray:
    """24 uniform bits per value of the row x32 (float32) under `seed`."""
    i = np.arange(n, dtype=np.uint64)
    lo, hi = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32), (i >> np.uint64(32)).astype(np.uint32)
    h = mix32(lo ^ mix32(hi ^ np.uint32(seed)))
    return mix32(h ^ x32.view(np.uint32)) >> np.uint32(8)


def stochastic_codes(x32, inv, q: int, draw) -> np.ndarray:
    """The stochastic rounding of x32 * inv (float32 arrays of one shape), as integers."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = (x32 * inv).astype(np.float32)
        f = np.floor(y)
        frac = (y - f).astype(np.float32)
        up = draw.astype(np.float32) < frac * np.float32(1 << 24)
        codes = f + up
    tiny = ((x32.view(np.uint32) & 0x7FFFFFFF) < (1 << 23)) | (np.abs(y) < np.float32(2.0**-24))
    return np.clip(np.where(tiny, 0, codes), -q, q)


def blocks_of(x, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x as flat float32 (exact widening), its zero-padded blocks (blocks, block), their largest
    |x| as bits)."""
    x32 = np.asarray(x).astype(np.float32).reshape(-1)
    padded = np.zeros(-(-x32.size // block) * block, np.float32)
    padded[: x32.size] = x32
    rows = padded.reshape(-1, block)
    return x32, rows, (rows.view(np.uint32) & 0x7FFFFFFF).max(axis=1)


def encode(x, bits: int, block: int, stochastic: bool = False, seed: int = 0) -> tuple[bytes, bool]:
    """(payload bytes, every value finite) of the flattened x (float32, bfloat16 or float16)."""
    x32, rows, amax_bits = blocks_of(x, block)
    n, blocks = x32.size, rows.shape[0]
    zero = (amax_bits >= INF_BITS) | (amax_bits < TINY_BITS)
    amax = np.where(zero, np.uint32(0x3F800000), amax_bits).astype(np.uint32).view(np.float32)
    q = np.float32(qmax(bits))
    scale = np.where(zero, np.float32(0), amax / q).astype(np.float32)
    inv = np.where(zero, np.float32(0), q / amax).astype(np.float32)
    if stochastic:
        draw = np.zeros(blocks * block, np.uint32)
        draw[:n] = draws(seed, n, x32)
        codes = stochastic_codes(rows, inv[:, None], int(q), draw.reshape(blocks, block))
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            codes = np.rint(rows * inv[:, None])
    codes = np.where(zero[:, None], 0, codes).astype(np.int8).reshape(-1)[:n]
    if bits == 8:
        code_bytes = codes.view(np.uint8)
    else:
        nib = (codes.astype(np.uint8) & 0x0F).astype(np.uint8)
        if n % 2:
            nib = np.append(nib, np.uint8(0))
        code_bytes = (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)
    out = scale.tobytes() + code_bytes.tobytes()
    out += b"\0" * (payload_bytes(n, bits, block) - len(out))
    return out, bool((amax_bits < INF_BITS).all())


def decode(payload: bytes, n: int, bits: int, block: int, dtype=np.float32) -> np.ndarray:
    """The n values of a payload, as float32 products rounded to `dtype`."""
    blocks = -(-n // block)
    buf = np.frombuffer(bytes(payload), np.uint8)
    scale = buf[: 4 * blocks].view(np.float32)
    raw = buf[4 * blocks :]
    if bits == 8:
        codes = raw[:n].view(np.int8).astype(np.int32)
    else:
        nib = np.stack([raw & 0x0F, raw >> 4], axis=1).reshape(-1)[:n].astype(np.int32)
        codes = np.where(nib >= 8, nib - 16, nib)
    values = codes.astype(np.float32) * np.repeat(scale, block)[:n]
    return values.astype(dtype)


def round_trip(x, bits: int, block: int, stochastic: bool = False, seed: int = 0) -> np.ndarray:
    """decode(encode(x)) in x's dtype and shape (the values a collective delivers for x)."""
    x = np.asarray(x)
    payload, _ = encode(x, bits, block, stochastic, seed)
    return decode(payload, x.size, bits, block, x.dtype).reshape(x.shape)


# --- rotated blocks (q8:h, q4:h: ffi/core/quant_rotated.h, written again) ------------------------
#
# Per block of B = 2^b values (the last one zero-padded), a = max |x|: NaN/Inf or a >= 2^116 makes
# the row not ok and its block a zero block, as does a < 2^-96 (ok). With E = a's exponent:
# q = rint(x * 2^(19 - E)) (float32 product), negated where negated(i); y = H q exactly (scipy's
# Hadamard matrix); sigma = sqrt(sum q^2); thresholds floor(t * G); code K + k (K - 1 - k for
# y < 0), k = how many thresholds lie below |y|; scale float32(g * 2^-(b + 35 - E)). 8 bits: G = g =
# sigma. 4 bits: G = sigma * f for f in SCALE_FACTORS, each with its least-squares gain g =
# 2^16 A / Q (A = sum |y| L(k), Q = sum L(k)^2, exact integers) clipped to [sigma / 2, 3 sigma / 2]
# and its error e = g (g Q - 2^17 A) (float64); the first of the least e is kept. Decode: a
# scale outside [2^-123, 2^98) gives zeros; else float32(H levels) * scale, negated where
# negated(i), rounded to the output type.

TINY_ROT_BITS = (127 - 96) << 23
HUGE_BITS = (127 + 116) << 23
MIN_SCALE_BITS, MAX_SCALE_BITS = (127 - 123) << 23, (127 + 98) << 23
SIGN_SEED = 0x9E3779B9


def negated(block: int) -> np.ndarray:
    """Whether each position of a block changes sign: the top bit of mix32(i ^ seed)."""
    i = np.arange(block, dtype=np.uint32) ^ np.uint32(SIGN_SEED)
    return (mix32(i) >> np.uint32(31)).astype(bool)


def rotated_payload_bytes(n: int, bits: int, block: int) -> int:
    """The plain layout's size for the whole blocks: every code of a padded block is sent."""
    return payload_bytes(-(-n // block) * block, bits, block)


SCALE_FACTORS = (1.0, 0.9, 1.1)


def k_of(y: np.ndarray, t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """How many of the thresholds floor(t * g) (per block) lie below |y|."""
    thr = np.floor(t[None, :] * g[:, None])
    return (np.abs(y)[:, :, None] > thr[:, None, :]).sum(axis=2)


def scale_choice(y, sigma, t, levels) -> tuple[np.ndarray, np.ndarray]:
    """(k, g) per block of q4:h's chosen candidate."""
    lv = np.asarray(levels, np.int64)
    for c, f in enumerate(SCALE_FACTORS):
        k = k_of(y, t, sigma * f)
        L = lv[k]
        a = (np.abs(y) * L).sum(axis=1).astype(np.float64) * 65536.0
        q = (L * L).sum(axis=1).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            g = np.minimum(np.maximum(a / q, sigma * 0.5), sigma * 1.5)
            e = g * (g * q - 2.0 * a)
        if c == 0:
            best_k, best_g, best_e = k, g, e
        else:
            better = e < best_e
            best_k = np.where(better[:, None], k, best_k)
            best_g, best_e = np.where(better, g, best_g), np.where(better, e, best_e)
    return best_k, best_g


def rotated_encode(x, bits: int, block: int, thresholds, levels) -> tuple[bytes, bool]:
    """(payload, ok) of q<bits>:h on the flattened x; `thresholds`: the positive half (float32),
    `levels`: the positive half as integers of 2^-16."""
    x32, rows, amax = blocks_of(x, block)
    n, b = x32.size, block.bit_length() - 1
    zero = (amax >= HUGE_BITS) | (amax < TINY_ROT_BITS)
    e = (amax >> 23).astype(np.int64) - 127
    factor = np.where(zero, 0, (273 - (amax >> 23).astype(np.int64)) << 23).astype(np.uint32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(np.where(zero[:, None], 0, rows) * factor.view(np.float32)[:, None])
    q = np.where(negated(block), -q, q).astype(np.int64)
    y = q @ hadamard(block).astype(np.int64).T
    sigma = np.sqrt((q * q).sum(axis=1).astype(np.float64))
    t = np.asarray(thresholds, np.float32).astype(np.float64)
    k, g = scale_choice(y, sigma, t, levels) if bits == 4 else (k_of(y, t, sigma), sigma)
    half = 1 << (bits - 1)
    codes = np.where(y < 0, half - 1 - k, half + k)
    codes = np.where(zero[:, None], 0, codes).astype(np.uint8).reshape(-1)
    if bits == 4:
        codes = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    scale = np.ldexp(g, -(b + 35 - e)).astype(np.float32)
    scale = np.where(zero, np.float32(0), scale)
    out = scale.tobytes() + codes.tobytes()
    out += b"\0" * (rotated_payload_bytes(n, bits, block) - len(out))
    return out, bool((amax < HUGE_BITS).all())


def rotated_decode(payload: bytes, n: int, bits: int, block: int, levels, dtype=np.float32):
    """The n values of a q<bits>:h payload (any bytes), rounded to `dtype`; `levels`: the
    positive half as integers of 2^-16."""
    blocks = -(-n // block)
    buf = np.frombuffer(bytes(payload), np.uint8)
    scale = buf[: 4 * blocks].copy().view(np.float32)
    raw = buf[4 * blocks : 4 * blocks + blocks * block * bits // 8]
    codes = raw if bits == 8 else np.stack([raw & 0x0F, raw >> 4], axis=1).reshape(-1)
    codes = codes.astype(np.int64).reshape(blocks, block)
    pos = np.asarray(levels, np.int64)
    signed = np.concatenate([-pos[::-1], pos])  # code c -> its level
    v = signed[codes] @ hadamard(block).astype(np.int64).T
    sb = scale.view(np.uint32)
    valid = (sb >= MIN_SCALE_BITS) & (sb < MAX_SCALE_BITS)
    with np.errstate(invalid="ignore", over="ignore"):
        x = v.astype(np.float32) * np.where(valid, scale, np.float32(0))[:, None]
    x = np.where(negated(block), -x, x)
    x = np.where(valid[:, None], x, np.float32(0))
    with np.errstate(over="ignore"):  # float16 rounds past 65504 to inf, as astype does
        return x.reshape(-1)[:n].astype(dtype)
