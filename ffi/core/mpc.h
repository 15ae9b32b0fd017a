// MPC lossless codec core, host and device code: Yang, Mukka, Hesaaraki, Burtscher, "MPC: A
// Massively Parallel Compression Algorithm for Scientific Data" (IEEE Cluster 2015), pipeline 1.2.
// Integer operations only, so every bit pattern (NaN payloads, -0.0, denormals, Inf) round-trips.
// This header: the format, its sizes and checks; core/mpc_chunk.h: the chunk pipeline.
//
// Transform of one chunk (up to 1024 words of W bits; chunks are independent):
//   1. d[i] = x[i] - x[i - dim] (wraparound), d[i] = x[i] for i < dim: a chunk never looks outside
//      itself. Words i >= m of a partial chunk of m words are d[i] = 0.
//   2. Tile j holds words d[jW .. jW+W-1]; transpose its W x W bit matrix: plane b of tile j has
//      bit k = bit b of d[jW+k]. y[jW + b] = plane b of tile j (the planes of a tile in a row).
//   3. e[t] = y[t] - y[t-1] (wraparound), e[0] = y[0].
//   4. Zero elimination: bitmap word r (32 bits) has bit l set iff e[32r + l] != 0, and a top word
//      has bit r set iff bitmap word r != 0.
//   Measured alternatives (float32/bf16 random walks, smooth fields, N(0, 0.02) weights): zigzag
//   after step 1 and listing y plane by plane across tiles gained on very smooth fields (3.8x vs
//   2.8x) but lost everything on weight-like noise (1.0x vs 1.10x); zigzag alone lost a little
//   everywhere (walk 1.46x vs 1.52x). So this is plain MPC 1.2.
// Payload (little-endian; every row of a batch is a payload of `capacity` bytes, a multiple of 8):
//   offset 0   u32  magic 'M','P','C', version 1
//          4   u8   word bytes (2, 4, 8)        5  u8  dim (1..64)      6  u16  zero
//          8   u32  n (words)                  12  u32 used: bytes the payload needs in all
//         16   u32  end[c] for each chunk c: end of chunk c's stream, counted from the stream area
//              zero pad to a multiple of 8; the stream area starts here, at header_bytes(n, wb)
//   then the chunk streams back to back, then zeros up to capacity.
//   A chunk of m words whose stream size is m * wb is stored raw (the input words). Otherwise the
//   size is smaller than that and the stream is: u32 top; the nonzero bitmap words in order; zeros
//   to a multiple of wb; the nonzero e words in order; zeros to a multiple of max(4, wb). Every
//   stream thus starts aligned to max(4, wb). When used > capacity (over budget) the header and
//   table are complete, the streams are cut at capacity, and the payload must not be decoded.
#pragma once
#include <cstring>
#include <string>

#include "core/common.h"

namespace jaxhc {
namespace mpc {

constexpr uint32_t kChunkWords = 1024;
constexpr uint32_t kMaxDim = 64;
constexpr uint32_t kMagic = 0x0143504Du;  // bytes 'M' 'P' 'C' 0x01
constexpr uint64_t kFixedHeader = 16;

JAXHC_HD uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
JAXHC_HD uint64_t chunk_count(uint64_t n) { return (n + kChunkWords - 1) / kChunkWords; }
JAXHC_HD uint32_t chunk_words(uint64_t n, uint64_t c) {
  uint64_t rest = n - c * kChunkWords;
  return rest < kChunkWords ? uint32_t(rest) : kChunkWords;
}
JAXHC_HD uint32_t stream_align(uint32_t wb) { return wb > 4 ? wb : 4; }

// Header and chunk table, a multiple of 8 bytes.
JAXHC_HD uint64_t header_bytes(uint64_t n, uint32_t /*word_bytes*/) {
  return align_up(kFixedHeader + 4 * chunk_count(n), 8);
}
// All chunks raw: the encoder never needs more.
JAXHC_HD uint64_t max_payload_bytes(uint64_t n, uint32_t word_bytes) {
  return align_up(header_bytes(n, word_bytes) + n * word_bytes, 8);
}
// Scratch the encoders take as an extra result: the CUDA encoder writes every chunk's stream
// there at its worst-case offset (the CPU encoder needs none).
JAXHC_HD uint64_t scratch_bytes(uint64_t n, uint32_t word_bytes) {
  return align_up(n * word_bytes, 8);
}
// Bytes of a compressed stream with nb nonzero bitmap words and nnz nonzero words.
JAXHC_HD uint32_t data_offset(uint32_t nb, uint32_t wb) {
  return uint32_t(align_up(4 + 4 * nb, wb));
}
JAXHC_HD uint32_t stream_bytes(uint32_t nb, uint32_t nnz, uint32_t wb) {
  return uint32_t(align_up(data_offset(nb, wb) + uint64_t(nnz) * wb, stream_align(wb)));
}

// The handlers' checks of an item of n words, the dim attribute and the payload capacity; an
// empty string when they are fine, else the reason.
inline std::string check_sizes(uint64_t n, uint32_t wb, int64_t dim, uint64_t capacity) {
  if (wb != 2 && wb != 4 && wb != 8) return "elements must be 16, 32 or 64-bit ints or floats";
  if (n == 0) return "cannot code an empty item";
  if (max_payload_bytes(n, wb) > 0x7FFFFFFFu)
    return std::to_string(n) + " words exceed the 2 GiB payload limit";
  if (dim < 1 || dim > int64_t(kMaxDim))
    return "dim " + std::to_string(dim) + " is outside 1.." + std::to_string(kMaxDim);
  if (capacity < header_bytes(n, wb) || capacity % 8)
    return "payload capacity " + std::to_string(capacity) +
           " must be a multiple of 8 and at least the header size " +
           std::to_string(header_bytes(n, wb));
  return "";
}

// Decode outcome of one payload, reported per row (the CPU decoder also raises it when strict).
// A payload error is reported for the header, else for the lowest bad chunk, in check order.
enum Status : int32_t {
  kOk = 0,
  kBadMagic,
  kBadWordSize,
  kBadDim,
  kBadCount,
  kBadUsed,
  kBadTable,
  kBadStream,
  kBadPadding,
  kStatusCount,
};

inline const char* status_message(int32_t s) {
  switch (s) {
    case kOk: return "ok";
    case kBadMagic: return "not an MPC v1 payload (bad magic or reserved bytes)";
    case kBadWordSize: return "payload word size differs from the output dtype";
    case kBadDim: return "payload dim differs from the decoder's dim";
    case kBadCount: return "payload word count differs from the output size";
    case kBadUsed: return "payload size field exceeds the capacity or disagrees with the table";
    case kBadTable: return "chunk table is corrupt (offsets out of order, misaligned or too large)";
    case kBadStream: return "chunk stream is malformed (bitmaps disagree with its size or words)";
    case kBadPadding: return "chunk stream has nonzero padding";
    default: return "unknown status";
  }
}

// Word access at an address aligned to the word: every access of this format is (payloads are
// 8-aligned, streams start at multiples of max(4, wb), and every field sits at a multiple of its
// size within them). Device code uses plain aligned accesses, since nvcc compiles a memcpy into
// byte accesses; host code uses memcpy, which compiles to one move and keeps type-based alias
// analysis out of it.
template <typename U>
JAXHC_HD U load(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const U*>(p);
#else
  U v;
  memcpy(&v, p, sizeof(U));
  return v;
#endif
}
template <typename U>
JAXHC_HD void store(uint8_t* p, U v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<U*>(p) = v;
#else
  memcpy(p, &v, sizeof(U));
#endif
}

// Writes the fixed header; the chunk table follows at kFixedHeader.
JAXHC_HD void write_header(uint8_t* p, uint32_t n, uint32_t wb, uint32_t dim, uint32_t used) {
  store<uint32_t>(p, kMagic);
  store<uint32_t>(p + 4, wb | dim << 8);  // word bytes, dim, reserved u16 zero
  store<uint32_t>(p + 8, n);
  store<uint32_t>(p + 12, used);
}
JAXHC_HD uint32_t table_end(const uint8_t* payload, uint64_t c) {
  return load<uint32_t>(payload + kFixedHeader + 4 * c);
}

// Checks the header against what the caller expects. Needs capacity >= header_bytes(n, wb).
JAXHC_HD Status check_header(const uint8_t* p, uint64_t capacity, uint32_t n, uint32_t wb,
                             uint32_t dim) {
  const uint32_t kind = load<uint32_t>(p + 4), used = load<uint32_t>(p + 12);
  if (load<uint32_t>(p) != kMagic || kind >> 16 != 0) return kBadMagic;
  if ((kind & 0xFF) != wb) return kBadWordSize;
  if ((kind >> 8 & 0xFF) != dim) return kBadDim;
  if (load<uint32_t>(p + 8) != n) return kBadCount;
  uint64_t nchunks = chunk_count(n), head = header_bytes(n, wb);
  if (used > capacity || used != head + table_end(p, nchunks - 1)) return kBadUsed;
  for (uint64_t i = kFixedHeader + 4 * nchunks; i < head; ++i)
    if (p[i]) return kBadMagic;
  return kOk;
}

// Locates chunk c's stream within a payload whose header passed check_header: [*begin, +*size)
// from the stream area. Checked on its own (no other chunk's entry needs to be valid), so the
// stream always lies inside `used` and is aligned for word loads.
JAXHC_HD Status locate_chunk(const uint8_t* p, uint32_t n, uint32_t wb, uint64_t c,
                             uint32_t* begin, uint32_t* size) {
  uint64_t nchunks = chunk_count(n);
  uint32_t start = c ? table_end(p, c - 1) : 0, end = table_end(p, c);
  uint32_t last = table_end(p, nchunks - 1);
  if (start > end || end > last || start % stream_align(wb)) return kBadTable;
  if (uint64_t(end - start) > uint64_t(chunk_words(n, c)) * wb) return kBadTable;
  *begin = start;
  *size = end - start;
  return kOk;
}

// Validates a compressed stream's bitmaps and padding against its size (m words, size < m * wb).
// On success *top is the top word and *nnz the number of stored words.
JAXHC_HD Status parse_stream(const uint8_t* s, uint32_t size, uint32_t wb, uint32_t* top,
                             uint32_t* nnz) {
  if (size < 4 || size % stream_align(wb)) return kBadStream;
  uint32_t t = load<uint32_t>(s), nb = uint32_t(popcount32(t)), count = 0;
  if (4 + 4 * nb > size) return kBadStream;
  for (uint32_t i = 0; i < nb; ++i) {
    uint32_t w = load<uint32_t>(s + 4 + 4 * i);
    if (!w) return kBadStream;
    count += uint32_t(popcount32(w));
  }
  if (stream_bytes(nb, count, wb) != size) return kBadStream;
  uint32_t data = data_offset(nb, wb), data_end = data + count * wb;
  for (uint32_t i = 4 + 4 * nb; i < data; ++i)
    if (s[i]) return kBadPadding;
  for (uint32_t i = data_end; i < size; ++i)
    if (s[i]) return kBadPadding;
  *top = t;
  *nnz = count;
  return kOk;
}

}  // namespace mpc
}  // namespace jaxhc
