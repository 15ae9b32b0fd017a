// The fused MPI collectives: compressed (or plain) psum, psum_scatter and all_gather in one call,
// with the encoding, the wire and the decoding of successive segments overlapped.
//
// The algorithms are those of jaxhc/collectives (the XLA transport), so results are bit for bit the
// same: psum splits the flattened input into P chunks of `per` values (zero-padded to `m`), each
// rank encodes all P chunks (its own too), rank q receives the P pieces of chunk q and adds the
// decoded pieces in rank order, encodes the sum, and every rank decodes every reduced chunk (its
// own too). Here each chunk travels in segments of whole, word-aligned ZFP blocks (or MPC chunks):
// a fixed-rate stream cut at such a boundary is the same bits as the whole stream, and MPC is
// lossless, so segmenting changes the schedule, not the values. Messages go by non-blocking
// point-to-point MPI on the collective's communicator; the calling thread encodes ahead, reduces
// and decodes whatever has arrived, and keeps MPI progressing in between.
//
// Fallbacks, as in the XLA transport but agreed without an extra round: every message carries the
// sender's flags. A lossy codec given a non-finite value anywhere makes the whole call plain; a
// non-finite reduced chunk makes the gather phase plain. Every rank sees every owner's flags by the
// end of the gather phase, so all ranks take the same branch. MPC over its budget sends that
// segment raw (lossless either way, so the values do not change; only the wire bytes do).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace jaxhc {
namespace mpi {

// Element types the fused collectives reduce (what the FFI handlers accept).
enum class Elem : int32_t { kF32 = 0, kF64 = 1, kBF16 = 2 };

inline size_t elem_bytes(Elem e) { return e == Elem::kF64 ? 8 : e == Elem::kBF16 ? 2 : 4; }

// How one segment of values travels. Implementations: ffi/mpi/codecs.h.
class SegmentCodec {
 public:
  // kRaw: send the values as they are (coding would not make them smaller); kOverBudget: the
  // same, counted as a fallback (a budget was set and exceeded); kFail: non-finite values.
  enum Result { kCoded, kRaw, kOverBudget, kFail };
  virtual ~SegmentCodec() = default;
  // Values per segment boundary: segments start at multiples of it (word-aligned ZFP blocks).
  virtual uint64_t align() const = 0;
  // Bytes a coded segment of `count` values may take (what a receive buffer must hold).
  virtual uint64_t capacity(uint64_t count) const = 0;
  // Whether kRaw can happen (then buffers also hold raw values).
  virtual bool may_send_raw() const = 0;
  // Encodes `count` values of type `e` into out (capacity(count) bytes); *bytes: bytes used.
  virtual Result encode(const void* src, Elem e, uint64_t count, uint8_t* out,
                        uint64_t* bytes) = 0;
  // Decodes a coded segment into `count` values of type `e`; false if the payload is malformed.
  virtual bool decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) = 0;
  // dst = the sum, in rank order 0..parts-1, of the values of each piece (rounded to `e`), added
  // in float32 (float64 for kF64) and rounded to `e` once. raw[p]: piece p holds raw values.
  virtual bool decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw,
                          int parts, Elem e, uint64_t count, void* dst) = 0;
};

// Traffic of one call on this rank, for jaxhc.accounting.
struct Stats {
  int64_t wire_bytes = 0;  // bytes this rank sent
  int64_t fallback = 0;    // 1: a phase went plain, or a segment went raw over its budget
};

// The buffers of the calls that run on one thread at a time (grow-only, kept across calls).
class Workspace;

// A workspace of its own (for a progress thread, ffi/mpi/queue.h); it lives until the process ends.
Workspace* new_workspace();

struct Options {
  uint64_t segment_bytes = 1 << 20;  // raw bytes per segment (rounded to the codec's alignment)
  // Where the call keeps its buffers; nullptr: the process's shared workspace (whose calls then
  // run one at a time). Calls that may run concurrently need workspaces of their own.
  Workspace* workspace = nullptr;
  // Error feedback (psum_scatter of float32 values only; nullptr: none). The call sends
  // y = x + residual_in (P * per values, added with denormals flushed as XLA:CPU adds) and writes
  // residual_out = y - decode(encode(y)) (P * per values), each segment's right after it is
  // encoded, while the wire runs: what jaxhc's unfused error feedback computes in separate
  // passes. A plain call (or an agreed fallback) sends y itself and writes zeros.
  const float* residual_in = nullptr;
  float* residual_out = nullptr;
};

// psum of n values: y (n values) = the reduced, decoded sum on every rank. codec nullptr: plain
// (rank-order sums as XLA:CPU's all-reduce: bfloat16 in float32, rounded once).
std::string psum(MPI_Comm comm, Elem e, const void* x, uint64_t n, void* y, SegmentCodec* codec,
                 const Options& opt, Stats* stats);

// psum_scatter of P rows of `per` values (x holds P * per values): y = this rank's reduced row.
// With opt.residual_in / residual_out: error feedback (see Options), float32 only.
std::string psum_scatter(MPI_Comm comm, Elem e, const void* x, uint64_t per, void* y,
                         SegmentCodec* codec, const Options& opt, Stats* stats);

// all_gather of k values per rank: y (P * k values) = every rank's decoded row, in rank order.
std::string all_gather(MPI_Comm comm, Elem e, const void* x, uint64_t k, void* y,
                       SegmentCodec* codec, const Options& opt, Stats* stats);

}  // namespace mpi
}  // namespace jaxhc
