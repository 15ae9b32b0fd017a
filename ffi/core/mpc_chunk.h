// The MPC chunk pipeline (steps 1-4 of core/mpc.h and their inverses), written once for every
// backend: host and device code, run by a "team" -- one CPU thread (SerialTeam, below; the CPU
// module adds an AVX2 one) or the 32 lanes of a GPU warp (cuda/mpc_cuda.cu). A chunk is
// T = 1024 / W tiles of W words of W bits. Each team member holds kSlots consecutive tiles as
// rows, a[k][q] = word k of tile first_tile() + q, so the bit transpose, both differences and
// the bitmap are loops over the slots (the CPU's SIMD lanes; a GPU lane's registers).
//
// A team provides what its members share and how words move between rows and memory:
//   kSlots; first_tile(), leader(), sync(); sum(v), bit_or(v) over members; scan(v[kSlots]):
//   exclusive prefix sums over tiles in order (wrapping), returning the total; shift(v[kSlots]):
//   each slot takes the value of the tile before (0 for tile 0); copy(dst, src, words);
//   delta_rows, pack, unpack, store_rows: the data movements of the same names below, and
//   transpose(a): transpose_bits of the rows (a team may do them faster, with the same result);
//   undelta(a, m, dim, x): x[i] = d[i] + x[i - dim].
#pragma once
#include "core/mpc.h"

#if defined(__CUDA_ARCH__)
#define JAXHC_UNROLL _Pragma("unroll")
#else
#define JAXHC_UNROLL
#endif

namespace jaxhc {
namespace mpc {

template <typename U>
struct Tiles {
  static constexpr int W = sizeof(U) * 8;     // words per tile, bits per word
  static constexpr int T = kChunkWords / W;   // tiles per chunk
};

// Transposes W x W bit matrices in place, `Lanes` of them side by side: row k of matrix j is
// a[k * Lanes + j]. Afterwards bit k of a[b * Lanes + j] is the old bit b of a[k * Lanes + j].
template <typename U, int Lanes>
JAXHC_HD void transpose_bits(U* a) {
  constexpr int W = sizeof(U) * 8;
  JAXHC_UNROLL
  for (int s = W / 2; s > 0; s >>= 1) {
    const U mask = U(U(~U(0)) / U((U(1) << s) | 1));  // bit positions p with (p & s) == 0
    JAXHC_UNROLL
    for (int k = 0; k < W; ++k) {
      if (k & s) continue;
      U* lo = a + k * Lanes;
      U* hi = a + (k + s) * Lanes;
      JAXHC_UNROLL
      for (int j = 0; j < Lanes; ++j) {
        U t = U(U(U(lo[j] >> s) ^ hi[j]) & mask);
        lo[j] ^= U(t << s);
        hi[j] ^= t;
      }
    }
  }
}

// The slots' nonzero masks (bit k of nz[q]: e of plane k of the slot's tile is nonzero) as the
// bitmap words they make up, and back: bitmap word r holds bits 32r.. of the masks in tile order.
template <typename U, int S>
JAXHC_HD void masks_to_words(const U* nz, uint32_t* bm) {
  constexpr int W = sizeof(U) * 8;
  if (W >= 32) {
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q)
      JAXHC_UNROLL
      for (int h = 0; h < W / 32; ++h) bm[q * (W / 32) + h] = uint32_t(uint64_t(nz[q]) >> 32 * h);
  } else {
    JAXHC_UNROLL
    for (int r = 0; r < S * W / 32; ++r) bm[r] = uint32_t(nz[2 * r]) | uint32_t(nz[2 * r + 1]) << 16;
  }
}
template <typename U, int S>
JAXHC_HD void words_to_masks(const uint32_t* bm, U* nz) {
  constexpr int W = sizeof(U) * 8;
  if (W >= 32) {
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) {
      uint64_t v = 0;
      JAXHC_UNROLL
      for (int h = 0; h < W / 32; ++h) v |= uint64_t(bm[q * (W / 32) + h]) << 32 * h;
      nz[q] = U(v);
    }
  } else {
    JAXHC_UNROLL
    for (int r = 0; r < S * W / 32; ++r) {
      nz[2 * r] = U(bm[r]);
      nz[2 * r + 1] = U(bm[r] >> 16);
    }
  }
}

// Words in memory as the encoder's input: in(i) = p[i].
template <typename U>
struct Words {
  const U* p;
  JAXHC_HD U operator()(uint32_t i) const { return p[i]; }
};

// Per-member state of the pipeline.
template <typename U, int S>
struct ChunkRows {
  static constexpr int W = sizeof(U) * 8, B = S * W / 32;  // B: bitmap words of the S tiles
  U a[W][S];
  U nz[S];        // bit k of nz[q]: e of plane k of the slot's tile is nonzero
  uint32_t bm[B];
  uint32_t count[S];  // stored words before the slot's tile
};

// Step 1 as rows: a[k][q] = d[i] for i = (first + q) * W + k, where d[i] = x[i] - x[i - dim],
// x[i] for i < dim, and 0 for i >= m; in(i) reads x[i] (i < m).
template <typename U, int S, typename In>
JAXHC_HD void delta_rows(int first, In in, uint32_t m, uint32_t dim, U (&a)[sizeof(U) * 8][S]) {
  constexpr int W = sizeof(U) * 8;
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) {
    const uint32_t i0 = uint32_t(first + q) * W;
    if (i0 >= dim && i0 + W <= m) {
      JAXHC_UNROLL
      for (int k = 0; k < W; ++k) a[k][q] = U(in(i0 + k) - in(i0 + k - dim));
    } else {
      JAXHC_UNROLL
      for (uint32_t k = 0, i = i0; k < uint32_t(W); ++k, ++i)
        a[k][q] = i >= m ? U(0) : i >= dim ? U(in(i) - in(i - dim)) : in(i);
    }
  }
}

// The nonzero words of the slots in y order (tile by tile, plane by plane) to packed[count[q]..].
// Ordered: the member is alone (or the members store one after another), so a zero word may be
// stored blindly: the next store overwrites it, or it lands at packed[nnz].
template <typename U, int S, bool Ordered>
JAXHC_HD void pack_rows(const ChunkRows<U, S>& r, U* packed) {
  constexpr int W = sizeof(U) * 8;
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) {
    uint32_t pos = r.count[q];
    U bits = r.nz[q];
    JAXHC_UNROLL
    for (int k = 0; k < W; ++k, bits >>= 1) {
      if (Ordered || (bits & 1)) packed[pos] = r.a[k][q];
      pos += uint32_t(bits & 1);
    }
  }
}

// The inverse: a[k][q] = the next stored word where bit k of nz[q] is set, else 0. Reads
// stored[count[q] ..] and, blindly, the word after the last (which must exist).
template <typename U, int S>
JAXHC_HD void unpack_rows(const U* stored, ChunkRows<U, S>& r) {
  constexpr int W = sizeof(U) * 8;
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) {
    uint32_t pos = r.count[q];
    U bits = r.nz[q];
    JAXHC_UNROLL
    for (int k = 0; k < W; ++k, bits >>= 1) {
      const U bit = U(bits & 1);
      r.a[k][q] = U(stored[pos] & U(0 - bit));
      pos += uint32_t(bit);
    }
  }
}

// Rows back to words: x[i] = a[k][q] for i = (first + q) * W + k < m.
template <typename U, int S>
JAXHC_HD void store_rows(int first, const U (&a)[sizeof(U) * 8][S], U* x, uint32_t m) {
  constexpr int W = sizeof(U) * 8;
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) {
    const uint32_t i0 = uint32_t(first + q) * W;
    JAXHC_UNROLL
    for (int k = 0; k < W; ++k)
      if (i0 + k < m) x[i0 + k] = a[k][q];
  }
}

// Encodes the chunk of m words whose word i is in(i) (i < m). Returns the stream size; when it is
// m * sizeof(U) the chunk is stored raw (the caller copies the input) and `stage` is untouched,
// else the stream is in stage[0, size). `stage` holds kChunkWords + 8 words and may be where
// in() reads from (nothing is staged before every member has read its input).
template <typename U, typename Team, typename In>
JAXHC_HD uint32_t encode_chunk(const Team& team, In in, uint32_t m, uint32_t dim,
                               ChunkRows<U, Team::kSlots>& r, uint8_t* stage) {
  constexpr int W = Tiles<U>::W, T = Tiles<U>::T, S = Team::kSlots, B = S * W / 32;
  constexpr uint32_t wb = sizeof(U);
  const int first = team.first_tile();
  team.delta_rows(in, m, dim, r.a);  // step 1
  team.sync();
  team.transpose(r.a);  // step 2: a[b][q] = plane b of the tile = y[tile * W + b]
  // step 3: e[t] = y[t] - y[t-1]; plane 0 follows plane W-1 of the tile before
  U last[S];
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) last[q] = r.a[W - 1][q];
  team.shift(last);
  JAXHC_UNROLL
  for (int k = W - 1; k > 0; --k)
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) r.a[k][q] = U(r.a[k][q] - r.a[k - 1][q]);
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) r.a[0][q] = U(r.a[0][q] - last[q]);
  // step 4: the bitmap, its top word and the count of stored words
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) r.nz[q] = 0;
  JAXHC_UNROLL
  for (int k = 0; k < W; ++k) {
    const U bit = U(U(1) << k);
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) r.nz[q] |= r.a[k][q] != 0 ? bit : U(0);  // a select: SIMD
  }
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q)
    if (first + q >= T) r.nz[q] = 0;  // an empty slot (a GPU lane past the tiles)
  masks_to_words<U, S>(r.nz, r.bm);
  const int word0 = first * W / 32;
  uint32_t top = 0, nnz = 0;
  JAXHC_UNROLL
  for (int b = 0; b < B; ++b) {
    top |= word0 + b < 32 ? uint32_t(r.bm[b] != 0) << (word0 + b) : 0u;
    nnz += uint32_t(popcount32(r.bm[b]));
  }
  top = team.bit_or(top);
  nnz = team.sum(nnz);
  const uint32_t nb = uint32_t(popcount32(top)), size = stream_bytes(nb, nnz, wb);
  if (size >= m * wb) return m * wb;
  // the stream: top word, nonzero bitmap words, zeros to wb, stored words, zeros to max(4, wb)
  const uint32_t data = data_offset(nb, wb);
  if (team.leader()) {
    store<uint32_t>(stage, top);
    if (data > 4 + 4 * nb) store<uint32_t>(stage + 4 + 4 * nb, 0);           // wb = 8 only
    if (size > data + nnz * wb) store<uint16_t>(stage + data + nnz * wb, 0);  // wb = 2 only
  }
  JAXHC_UNROLL
  for (int b = 0; b < B; ++b)
    if (r.bm[b])
      store<uint32_t>(stage + 4 + 4 * popcount32(top & ((1u << (word0 + b)) - 1)), r.bm[b]);
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) r.count[q] = uint32_t(popcount64(uint64_t(r.nz[q])));
  team.scan(r.count);
  team.pack(r, reinterpret_cast<U*>(stage + data));
  team.sync();
  return size;
}

// Decodes the compressed stream s (size bytes, located: size < m * sizeof(U)) into x[0, m).
// `stage` holds kChunkWords + 8 words (the stored words are copied there first).
template <typename U, typename Team>
JAXHC_HD Status decode_chunk(const Team& team, const uint8_t* s, uint32_t size, uint32_t m,
                             uint32_t dim, ChunkRows<U, Team::kSlots>& r, U* stage, U* x) {
  constexpr int W = Tiles<U>::W, T = Tiles<U>::T, S = Team::kSlots, B = S * W / 32;
  constexpr uint32_t wb = sizeof(U);
  const int first = team.first_tile(), word0 = first * W / 32;
  uint32_t top, nnz;
  if (Status st = parse_stream(s, size, wb, &top, &nnz)) return st;
  JAXHC_UNROLL
  for (int b = 0; b < B; ++b) {
    const int w = word0 + b;
    r.bm[b] = w < 32 && (top >> w & 1)
                  ? load<uint32_t>(s + 4 + 4 * popcount32(top & ((1u << w) - 1)))
                  : 0u;
  }
  words_to_masks<U, S>(r.bm, r.nz);
  team.copy(stage, reinterpret_cast<const U*>(s + data_offset(uint32_t(popcount32(top)), wb)),
            nnz);
  if (team.leader()) stage[nnz] = 0;
  team.sync();
  // every stored word must be nonzero: the bitmap says so
  uint32_t zero = 0;
  for (uint32_t i = team.member(); i < nnz; i += team.members()) zero |= stage[i] == 0;
  if (team.bit_or(zero)) return kBadStream;
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) r.count[q] = uint32_t(popcount64(uint64_t(r.nz[q])));
  team.scan(r.count);
  team.unpack(stage, r);
  // y = prefix sums of e: within each tile's planes, then carried across tiles
  JAXHC_UNROLL
  for (int k = 1; k < W; ++k)
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) r.a[k][q] = U(r.a[k][q] + r.a[k - 1][q]);
  U carry[S];
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) carry[q] = first + q < T ? r.a[W - 1][q] : U(0);
  team.scan(carry);
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q)
    if (first + q >= T) carry[q] = 0;  // an empty slot stays zero
  JAXHC_UNROLL
  for (int k = 0; k < W; ++k)
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) r.a[k][q] = U(r.a[k][q] + carry[q]);
  team.transpose(r.a);  // a[k][q] = d[tile * W + k]
  // words past m were zero before step 1 (an empty slot decodes to zeros too)
  uint32_t pad = 0;
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) {
    const uint32_t i0 = uint32_t(first + q) * W;
    if (i0 + W > m)
      JAXHC_UNROLL
      for (int k = 0; k < W; ++k) pad |= i0 + k >= m && r.a[k][q] != 0;
  }
  if (team.bit_or(pad)) return kBadPadding;
  team.sync();
  if (dim != 1) {
    team.undelta(r.a, m, dim, x);
    return kOk;
  }
  // dim 1: x is the prefix sum of d, within each tile's rows, then carried across tiles
  JAXHC_UNROLL
  for (int k = 1; k < W; ++k)
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) r.a[k][q] = U(r.a[k][q] + r.a[k - 1][q]);
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q) carry[q] = first + q < T ? r.a[W - 1][q] : U(0);
  team.scan(carry);
  JAXHC_UNROLL
  for (int q = 0; q < S; ++q)
    if (first + q >= T) carry[q] = 0;  // an empty slot stays zero
  JAXHC_UNROLL
  for (int k = 0; k < W; ++k)
    JAXHC_UNROLL
    for (int q = 0; q < S; ++q) r.a[k][q] = U(r.a[k][q] + carry[q]);
  team.store_rows(r.a, x, m);
  return kOk;
}

// One CPU thread as the team: all tiles are its slots, the data movements are the plain loops.
template <typename U>
struct SerialTeam {
  static constexpr int W = Tiles<U>::W, kSlots = Tiles<U>::T;
  using Rows = U[W][kSlots];
  JAXHC_HD int first_tile() const { return 0; }
  JAXHC_HD uint32_t member() const { return 0; }
  JAXHC_HD uint32_t members() const { return 1; }
  JAXHC_HD bool leader() const { return true; }
  JAXHC_HD void sync() const {}
  JAXHC_HD uint32_t sum(uint32_t v) const { return v; }
  JAXHC_HD uint32_t bit_or(uint32_t v) const { return v; }
  template <typename V>
  JAXHC_HD V scan(V (&v)[kSlots]) const {
    V acc = 0;
    for (int q = 0; q < kSlots; ++q) {
      V t = v[q];
      v[q] = acc;
      acc = V(acc + t);
    }
    return acc;
  }
  JAXHC_HD void shift(U (&v)[kSlots]) const {
    for (int q = kSlots - 1; q > 0; --q) v[q] = v[q - 1];
    v[0] = 0;
  }
  JAXHC_HD void copy(U* dst, const U* src, uint32_t words) const {
    memcpy(dst, src, words * sizeof(U));
  }
  template <typename In>
  JAXHC_HD void delta_rows(In in, uint32_t m, uint32_t dim, Rows& a) const {
    mpc::delta_rows<U, kSlots>(0, in, m, dim, a);
  }
  JAXHC_HD void transpose(Rows& a) const { transpose_bits<U, kSlots>(&a[0][0]); }
  JAXHC_HD void pack(const ChunkRows<U, kSlots>& r, U* packed) const {
    pack_rows<U, kSlots, true>(r, packed);
  }
  JAXHC_HD void unpack(const U* stored, ChunkRows<U, kSlots>& r) const {
    unpack_rows<U, kSlots>(stored, r);
  }
  JAXHC_HD void store_rows(const Rows& a, U* x, uint32_t m) const {
    mpc::store_rows<U, kSlots>(0, a, x, m);
  }
  // x[i] = d[i] + x[i - dim], tile by tile in order; d[i] = a[i % W][i / W].
  JAXHC_HD void undelta(const Rows& a, uint32_t m, uint32_t dim, U* x) const {
    for (int j = 0; j < kSlots; ++j) {
      const uint32_t i0 = uint32_t(j * W);
      for (uint32_t k = 0, i = i0; k < uint32_t(W) && i < m; ++k, ++i)
        x[i] = i >= dim ? U(a[k][j] + x[i - dim]) : a[k][j];
    }
  }
};

}  // namespace mpc
}  // namespace jaxhc
