// The block loops of the CPU ZFP kernels (instantiated per kernel in cpu/zfp_kernels.cc): blocks
// [b0, b1) of one row, coded into its stream from the 64-bit word holding block b0's first bit
// (b0 starts a word), or decoded from the row's stream. The scalar loops code one block at a
// time (core/zfp.h); the lane loops code whole groups of L::kLanes blocks (core/zfp_lanes.h) and
// hand the rest (a group the lane coder declines, the row's last blocks) to the scalar coder.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/floats.h"
#include "core/zfp.h"
#include "core/zfp_lanes.h"
#include "core/zfp_nd.h"
#include "core/zfp_nd_lanes.h"
#include "cpu/zfp_kernels.h"

namespace jaxhc {
namespace zfp {
namespace cpu {

// Appends bit fields to 64-bit little-endian words, LSB first.
class WordWriter {
 public:
  explicit WordWriter(uint64_t* out) : out_(out) {}

  // Appends the n low bits of v (0 <= n <= 64, no bits above them).
  void put(uint64_t v, int n) {
    acc_ |= v << fill_;
    if (fill_ + n >= 64) {
      *out_++ = acc_;
      acc_ = fill_ ? v >> (64 - fill_) : 0;
      fill_ += n - 64;
    } else {
      fill_ += n;
    }
  }

  void flush() {
    if (fill_) *out_ = acc_;
  }

 private:
  uint64_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

// The element type of a row of E (core/floats.h), and the type its stream codes.
template <Elem E>
struct ElemType;
template <>
struct ElemType<Elem::kF32> {
  using T = float;
};
template <>
struct ElemType<Elem::kF64> {
  using T = double;
};
template <>
struct ElemType<Elem::kBF16> {
  using T = Bf16;
};
template <>
struct ElemType<Elem::kF16> {
  using T = F16;
};

template <Elem E>
using T_ = typename ElemType<E>::T;
template <Elem E>
using Io = Elems<T_<E>>;
template <Elem E>
using Coded_ = typename Io<E>::Coded;

// --- one block at a time (a block of 4^D values: core/zfp.h in 1-D, core/zfp_nd.h in 2-D/3-D) --

template <class Bits, Elem E, int D = 1, class Sink>
inline bool encode_one(const T_<E>* x, uint64_t n, uint64_t b, int maxbits, Sink& out) {
  Coded_<E> v[block_values(D)];
  load_block_d<D>(x, n, b, v);
  return encode_block_d<D, Bits>(v, maxbits, out);
}

template <class Bits, Elem E, int D = 1>
inline void decode_one(const uint64_t* row, uint64_t nwords, uint64_t b, int maxbits,
                       Coded_<E>* v) {
  uint64_t in[kBlockWords<D, Coded_<E>>];
  load_block_bits(row, nwords, b, maxbits, in);
  decode_block_d<D, Bits>(in, maxbits, v);
}

// Block b's values, rounded to E (and back to the coded type) as decode_sum adds them.
template <Elem E>
inline Coded_<E> rounded(Coded_<E> v) {
  return Io<E>::widen(Io<E>::narrow(v));
}

template <class Bits, Elem E, int D = 1>
bool encode_scalar(const T_<E>* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits,
                   uint64_t* words) {
  WordWriter out(words);
  bool ok = true;
  for (uint64_t b = b0; b < b1; b++) ok &= encode_one<Bits, E, D>(x, n, b, maxbits, out);
  out.flush();  // only the row's last range ends inside a word
  return ok;
}

template <class Bits, Elem E, int D = 1>
void decode_scalar(const uint64_t* row, uint64_t nwords, uint64_t n, uint64_t b0, uint64_t b1,
                   int maxbits, T_<E>* x) {
  constexpr int S = block_values(D);
  for (uint64_t b = b0; b < b1; b++) {
    Coded_<E> v[S];
    decode_one<Bits, E, D>(row, nwords, b, maxbits, v);
    for (uint64_t i = 0; i < S && S * b + i < n; i++) x[S * b + i] = Io<E>::narrow(v[i]);
  }
}

template <class Bits, Elem E, int D = 1>
void decode_sum_scalar(const uint64_t* const* rows, int parts, uint64_t nwords, uint64_t n,
                       uint64_t b0, uint64_t b1, int maxbits, T_<E>* x) {
  constexpr int S = block_values(D);
  for (uint64_t b = b0; b < b1; b++) {
    Coded_<E> acc[S], v[S];
    decode_one<Bits, E, D>(rows[0], nwords, b, maxbits, acc);
    for (int i = 0; i < S; i++) acc[i] = rounded<E>(acc[i]);
    for (int p = 1; p < parts; p++) {
      decode_one<Bits, E, D>(rows[p], nwords, b, maxbits, v);
      for (int i = 0; i < S; i++) acc[i] += rounded<E>(v[i]);
    }
    for (uint64_t i = 0; i < S && S * b + i < n; i++) x[S * b + i] = Io<E>::narrow(acc[i]);
  }
}

// --- groups of L::kLanes blocks (float32 coded) ------------------------------------------------

// The scalar coder where the lane loops below hand it blocks (those the lanes do not take, and a
// range's last ones): called, not inlined, so that the lane loops' `flatten` does not compile a
// copy of it into every lane loop (one per lane count, element type and direction). The same
// functions, so the same bytes; they run for rare blocks and at most a group per range.
template <class Bits, Elem E, int D = 1, class Sink>
[[gnu::noinline]] bool encode_one_call(const T_<E>* x, uint64_t n, uint64_t b, int maxbits,
                                       Sink& out) {
  return encode_one<Bits, E, D>(x, n, b, maxbits, out);
}
template <class Bits, int D, class Sink>
[[gnu::noinline]] bool encode_block_call(const float* v, int maxbits, Sink& out) {
  return encode_block_d<D, Bits>(v, maxbits, out);
}
template <class Bits, Elem E, int D = 1>
[[gnu::noinline]] void decode_one_call(const uint64_t* row, uint64_t nwords, uint64_t b,
                                       int maxbits, Coded_<E>* v) {
  decode_one<Bits, E, D>(row, nwords, b, maxbits, v);
}
template <class Bits, Elem E, int D = 1>
[[gnu::noinline]] bool encode_scalar_call(const T_<E>* x, uint64_t n, uint64_t b0, uint64_t b1,
                                          int maxbits, uint64_t* words) {
  return encode_scalar<Bits, E, D>(x, n, b0, b1, maxbits, words);
}
template <class Bits, Elem E, int D = 1>
[[gnu::noinline]] void decode_scalar_call(const uint64_t* row, uint64_t nwords, uint64_t n,
                                          uint64_t b0, uint64_t b1, int maxbits, T_<E>* x) {
  decode_scalar<Bits, E, D>(row, nwords, n, b0, b1, maxbits, x);
}
template <class Bits, Elem E, int D = 1>
[[gnu::noinline]] void decode_sum_scalar_call(const uint64_t* const* rows, int parts,
                                              uint64_t nwords, uint64_t n, uint64_t b0,
                                              uint64_t b1, int maxbits, T_<E>* x) {
  decode_sum_scalar<Bits, E, D>(rows, parts, nwords, n, b0, b1, maxbits, x);
}

template <class L, Elem E>
inline void load_values(const T_<E>* x, typename L::V* f) {
  if constexpr (E == Elem::kF32)
    L::load(x, f);
  else if constexpr (E == Elem::kBF16)
    L::load_bf16(reinterpret_cast<const uint16_t*>(x), f);
  else
    L::load_f16(reinterpret_cast<const uint16_t*>(x), f);
}

// NoNaN: f holds no NaN (decoded values are finite or infinite): bfloat16 rounds it for less.
template <class L, Elem E, bool NoNaN = false>
inline void store_values(const typename L::V* f, T_<E>* x) {
  if constexpr (E == Elem::kF32) {
    L::store(f, x);
  } else if constexpr (E == Elem::kBF16) {
    using V = typename L::V;
    V h[4];  // bfloat16 bits in the high half of each lane (rounded to nearest even)
    for (int i = 0; i < 4; i++) {
      V odd = L::and_(L::template srl<16>(f[i]), L::set1(1));
      h[i] = NoNaN ? L::add(L::add(f[i], L::set1(0x7fff)), odd) : L::round_bf16(f[i]);
    }
    L::store_high_halves(h, reinterpret_cast<uint16_t*>(x));
  } else {
    L::store_f16(f, reinterpret_cast<uint16_t*>(x));
  }
}

template <class L, Elem E>
inline void round_values(typename L::V* f) {
  for (int i = 0; i < 4; i++) {
    if constexpr (E == Elem::kBF16)
      f[i] = L::round_bf16(f[i]);
    else if constexpr (E == Elem::kF16)
      f[i] = L::round_f16(f[i]);
  }
}

// Whole 32- or 64-bit stream words per block (rates 8 and 16): groups move as vectors.
constexpr bool word_blocks(int W, int maxbits) { return W <= 2 && maxbits == 32 * W; }

// The lane loops take a kit G (cpu/zfp_loops.h): its lane type G::L, its scalar bits G::Bits, and
// its group coders, out of line: G::encode<W> (lanes::Coder<L>::encode), G::decode<W> (two groups:
// decode_group below), G::encode_nd<D> and G::decode_nd<D> (2-D/3-D groups).
template <class G, int W, Elem E>
bool encode_lanes(const T_<E>* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits,
                  uint64_t* words) {
  using L = typename G::L;
  using Bits = typename G::Bits;
  using V = typename L::V;
  constexpr int K = L::kLanes;
  const uint64_t full = std::min(b1, n / 4);
  const bool whole = word_blocks(W, maxbits);
  WordWriter out(words);
  bool ok = true;
  uint64_t b = b0;
  for (; b + K <= full; b += K) {
    V f[4], a[W];
    load_values<L, E>(x + 4 * b, f);
    if (G::template encode<W>(f, maxbits, a)) {
      if (whole) {
        if constexpr (W == 1) L::store_words32(a[0], reinterpret_cast<uint32_t*>(words) + (b - b0));
        if constexpr (W == 2) L::store_words64(a, words + (b - b0));
        continue;
      }
      alignas(64) uint32_t lane[W][K];
      for (int i = 0; i < W; i++) std::memcpy(lane[i], &a[i], sizeof(V));
      for (int j = 0; j < K; j++)
        for (int i = 0; i < W && 32 * i < maxbits; i++)
          out.put(lane[i][j], std::min(32, maxbits - 32 * i));
    } else if (whole) {  // whole words: each block's word(s) in place
      for (int j = 0; j < K; j++) {
        BlockBits<2> bits;
        ok &= encode_one_call<Bits, E>(x, n, b + j, maxbits, bits);
        if (W == 1)
          reinterpret_cast<uint32_t*>(words)[b - b0 + j] = static_cast<uint32_t>(bits.w[0]);
        else
          words[b - b0 + j] = bits.w[0];
      }
    } else {
      for (int j = 0; j < K; j++) ok &= encode_one_call<Bits, E>(x, n, b + j, maxbits, out);
    }
  }
  if (whole)
    return encode_scalar_call<Bits, E>(x, n, b, b1, maxbits, words + (b - b0) * maxbits / 64) &&
           ok;
  for (; b < b1; b++) ok &= encode_one_call<Bits, E>(x, n, b, maxbits, out);
  out.flush();
  return ok;
}

// The float32 bits of the values of blocks [b, b + G L::kLanes), group i (lane j holding block
// b + i L::kLanes + j) at f + 4 i.
template <class L, class Bits, int W, int G>
inline void decode_group(const uint64_t* row, uint64_t nwords, uint64_t b, int maxbits,
                         typename L::V* f) {
  using V = typename L::V;
  constexpr int K = L::kLanes;
  V a[W * G];
  if (word_blocks(W, maxbits)) {
    for (int i = 0; i < G; i++) {
      if constexpr (W == 1)
        a[i] = L::load_words32(reinterpret_cast<const uint32_t*>(row) + b + K * i);
      if constexpr (W == 2) L::load_words64(row + b + K * i, a + 2 * i);
    }
  } else {
    alignas(64) uint32_t lane[W][K];
    for (int i = 0; i < G; i++) {
      for (int j = 0; j < K; j++) {
        uint64_t in[2] = {0, 0};
        load_block_bits(row, nwords, b + K * i + j, maxbits, in);
        for (int h = 0; h < 2; h++) in[h] = detail::low_bits(in[h], std::max(0, maxbits - 64 * h));
        for (int h = 0; h < W; h++)
          lane[h][j] = static_cast<uint32_t>(in[h >> 1] >> (32 * (h & 1)));
      }
      for (int h = 0; h < W; h++) std::memcpy(&a[W * i + h], lane[h], sizeof(V));
    }
  }
  if (lanes::Coder<L>::template decode<W, G>(a, maxbits, f)) return;
  alignas(64) float v[4 * K];
  for (int i = 0; i < G; i++) {
    for (int j = 0; j < K; j++)
      decode_one_call<Bits, Elem::kF32>(row, nwords, b + K * i + j, maxbits, v + 4 * j);
    L::load(v, f + 4 * i);
  }
}

// Two groups at a time (their plane chains overlap); a last single group and the row's last
// blocks take the scalar coder.
template <class G, int W, Elem E>
void decode_lanes(const uint64_t* row, uint64_t nwords, uint64_t n, uint64_t b0, uint64_t b1,
                  int maxbits, T_<E>* x) {
  using L = typename G::L;
  using Bits = typename G::Bits;
  constexpr int K = 2 * L::kLanes;
  const uint64_t full = std::min(b1, n / 4);
  uint64_t b = b0;
  for (; b + K <= full; b += K) {
    typename L::V f[8];
    G::template decode<W>(row, nwords, b, maxbits, f);
    store_values<L, E, true>(f, x + 4 * b);
    store_values<L, E, true>(f + 4, x + 4 * (b + L::kLanes));
  }
  decode_scalar_call<Bits, E>(row, nwords, n, b, b1, maxbits, x);
}

template <class G, int W, Elem E>
void decode_sum_lanes(const uint64_t* const* rows, int parts, uint64_t nwords, uint64_t n,
                      uint64_t b0, uint64_t b1, int maxbits, T_<E>* x) {
  using L = typename G::L;
  using Bits = typename G::Bits;
  constexpr int K = 2 * L::kLanes;  // two groups at a time, as decode_lanes
  const uint64_t full = std::min(b1, n / 4);
  uint64_t b = b0;
  for (; b + K <= full; b += K) {
    typename L::V acc[8], f[8];
    G::template decode<W>(rows[0], nwords, b, maxbits, acc);
    round_values<L, E>(acc), round_values<L, E>(acc + 4);
    for (int p = 1; p < parts; p++) {
      G::template decode<W>(rows[p], nwords, b, maxbits, f);
      round_values<L, E>(f), round_values<L, E>(f + 4);
      for (int i = 0; i < 8; i++) acc[i] = L::fadd(acc[i], f[i]);
    }
    store_values<L, E>(acc, x + 4 * b);
    store_values<L, E>(acc + 4, x + 4 * (b + L::kLanes));
  }
  decode_sum_scalar_call<Bits, E>(rows, parts, nwords, n, b, b1, maxbits, x);
}

// --- groups of L::kLanes 2-D/3-D blocks (float32 coded; core/zfp_nd_lanes.h) --------------------

// Lane j's planes from a group's plane words.
template <class C>
inline void lane_planes(const typename C::Planes& planes, int j, uint64_t* p) {
  for (int k = 0; k < 32; k++) {
    p[k] = planes[0][k][j];
    if constexpr (C::H > 1) p[k] |= static_cast<uint64_t>(planes[1][k][j]) << 32;
  }
}

// Blocks v[0..L::kLanes) (block j's float32 values at v[j]) appended to out; returns whether
// every value is finite.
template <class L, class Bits, int D>
inline bool encode_group_nd(const float (*v)[block_values(D)], int maxbits, WordWriter& out) {
  using C = lanes::NdCoder<L, D>;
  constexpr int S = C::S, K = C::K;
  const int budget = maxbits - Format<float>::kMinBits;
  alignas(64) uint32_t t[S][K];
  for (int i = 0; i < S; i++)
    for (int j = 0; j < K; j++) std::memcpy(&t[i][j], &v[j][i], 4);
  typename L::V f[S];
  for (int i = 0; i < S; i++) f[i] = L::load_words32(t[i]);
  alignas(64) uint32_t head[K];
  alignas(64) typename C::Planes planes;
  if (!C::encode(f, head, planes)) {
    bool ok = true;
    for (int j = 0; j < K; j++) ok &= encode_block_call<Bits, D>(v[j], maxbits, out);
    return ok;
  }
  for (int j = 0; j < K; j++) {
    if (!head[j]) {
      put_zeros(out, maxbits);
      continue;
    }
    out.put(head[j], Format<float>::kMinBits);
    uint64_t p[32];
    lane_planes<C>(planes, j, p);
    int maxprec = detail::precision(static_cast<int>(head[j] >> 1) - 127, D);
    put_zeros(out, budget - detail::encode_planes<S, 32, Bits>(p, maxprec, out, budget));
  }
  return true;
}

template <class G, int D, Elem E>
bool encode_nd_lanes(const T_<E>* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits,
                     uint64_t* words) {
  using L = typename G::Nd;
  using Bits = typename G::Bits;
  constexpr int S = block_values(D), K = L::kLanes;
  WordWriter out(words);
  bool ok = true;
  uint64_t b = b0;
  for (; b + K <= b1; b += K) {
    alignas(64) float v[K][S];
    for (int j = 0; j < K; j++) load_block_nd<D>(x, n, b + j, v[j]);
    ok &= G::template encode_nd<D>(v, maxbits, out);
  }
  for (; b < b1; b++) ok &= encode_one_call<Bits, E, D>(x, n, b, maxbits, out);
  out.flush();
  return ok;
}

// The values of blocks [b, b + L::kLanes): block b + j's at v[j].
template <class L, class Bits, int D>
inline void decode_group_nd(const uint64_t* row, uint64_t nwords, uint64_t b, int maxbits,
                            float (*v)[block_values(D)]) {
  using C = lanes::NdCoder<L, D>;
  constexpr int S = C::S, K = C::K;
  alignas(64) uint32_t ebits[K];
  bool nonzero[K];
  alignas(64) typename C::Planes planes;
  for (int j = 0; j < K; j++) {
    uint64_t in[kBlockWords<D, float>];
    load_block_bits(row, nwords, b + j, maxbits, in);
    uint64_t p[32];
    nonzero[j] = in[0] & 1;
    ebits[j] = static_cast<uint32_t>(in[0] >> 1) & 255;
    if (nonzero[j])
      detail::decode_planes<S, 32>(in, detail::precision(static_cast<int>(ebits[j]) - 127, D),
                                   p, Format<float>::kMinBits, maxbits);
    else
      for (int k = 0; k < 32; k++) p[k] = 0;
    for (int k = 0; k < 32; k++) {
      planes[0][k][j] = static_cast<uint32_t>(p[k]);
      if constexpr (C::H > 1) planes[1][k][j] = static_cast<uint32_t>(p[k] >> 32);
    }
  }
  typename L::V f[S];
  if (!C::decode(ebits, nonzero, planes, f)) {
    for (int j = 0; j < K; j++)
      decode_one_call<Bits, Elem::kF32, D>(row, nwords, b + j, maxbits, v[j]);
    return;
  }
  alignas(64) uint32_t t[S][K];
  for (int i = 0; i < S; i++) L::store_words32(f[i], t[i]);
  for (int j = 0; j < K; j++)
    for (int i = 0; i < S; i++) std::memcpy(&v[j][i], &t[i][j], 4);
}

template <class G, int D, Elem E>
void decode_nd_lanes(const uint64_t* row, uint64_t nwords, uint64_t n, uint64_t b0, uint64_t b1,
                     int maxbits, T_<E>* x) {
  using Bits = typename G::Bits;
  constexpr int S = block_values(D), K = G::Nd::kLanes;
  uint64_t b = b0;
  for (; b + K <= b1; b += K) {
    alignas(64) float v[K][S];
    G::template decode_nd<D>(row, nwords, b, maxbits, v);
    for (int j = 0; j < K; j++)
      for (uint64_t i = 0; i < S && S * (b + j) + i < n; i++)
        x[S * (b + j) + i] = Io<E>::narrow(v[j][i]);
  }
  decode_scalar_call<Bits, E, D>(row, nwords, n, b, b1, maxbits, x);
}

template <class G, int D, Elem E>
void decode_sum_nd_lanes(const uint64_t* const* rows, int parts, uint64_t nwords, uint64_t n,
                         uint64_t b0, uint64_t b1, int maxbits, T_<E>* x) {
  using Bits = typename G::Bits;
  constexpr int S = block_values(D), K = G::Nd::kLanes;
  uint64_t b = b0;
  for (; b + K <= b1; b += K) {
    alignas(64) float acc[K][S], v[K][S];
    G::template decode_nd<D>(rows[0], nwords, b, maxbits, acc);
    for (int j = 0; j < K; j++)
      for (int i = 0; i < S; i++) acc[j][i] = rounded<E>(acc[j][i]);
    for (int p = 1; p < parts; p++) {
      G::template decode_nd<D>(rows[p], nwords, b, maxbits, v);
      for (int j = 0; j < K; j++)
        for (int i = 0; i < S; i++) acc[j][i] += rounded<E>(v[j][i]);
    }
    for (int j = 0; j < K; j++)
      for (uint64_t i = 0; i < S && S * (b + j) + i < n; i++)
        x[S * (b + j) + i] = Io<E>::narrow(acc[j][i]);
  }
  decode_sum_scalar_call<Bits, E, D>(rows, parts, nwords, n, b, b1, maxbits, x);
}

}  // namespace cpu
}  // namespace zfp
}  // namespace jaxhc
