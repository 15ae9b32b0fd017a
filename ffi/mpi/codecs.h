// The segment codecs of the fused MPI collectives, on the CPU module's kernels.
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/quant_kernels.h"
#include "mpi/engine.h"

namespace jaxhc {
namespace mpi {

// Fixed-rate ZFP in blocks of 4^dims values: the same stream as the jaxhc_zfp_encode handler,
// one segment at a time (the CPU module's kernels, cpu/zfp_kernels.h). bfloat16 rows are coded
// as float32. Segments start on whole blocks, so they code as the row does.
class ZfpSegments final : public SegmentCodec {
 public:
  ZfpSegments(int maxbits, int dims) : maxbits_(maxbits), dims_(dims) {}
  // 64 blocks: whole 64-bit words at any rate
  uint64_t align() const override { return 64u << (2 * dims_); }
  uint64_t capacity(uint64_t count) const override;
  bool may_send_raw() const override { return false; }
  Result encode(const void* src, Elem e, uint64_t count, uint8_t* out, uint64_t* bytes) override;
  bool decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) override;
  bool decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw, int parts,
                  Elem e, uint64_t count, void* dst) override;

 private:
  int maxbits_, dims_;
};

// MPC, lossless: a segment travels coded when it fits `budget` x its raw bytes (and is smaller
// than raw), else as it is (the values are the same either way; only the wire bytes differ).
// budget <= 0: no budget beyond "smaller than raw".
class MpcSegments final : public SegmentCodec {
 public:
  MpcSegments(int dim, double budget) : dim_(dim), budget_(budget) {}
  uint64_t align() const override { return 1024; }  // whole MPC chunks
  uint64_t capacity(uint64_t count) const override { return capacity_for(count, 4); }
  bool may_send_raw() const override { return true; }
  Result encode(const void* src, Elem e, uint64_t count, uint8_t* out, uint64_t* bytes) override;
  bool decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) override;
  bool decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw, int parts,
                  Elem e, uint64_t count, void* dst) override;

 private:
  uint64_t capacity_for(uint64_t count, uint32_t wb) const;
  int dim_;
  double budget_;
  std::vector<uint8_t> pieces_;
};

// Block quantization, absmax (q8, q4) or rotated (q8:h, q4:h), rounding to nearest: the blocks of
// the jaxhc_quant_encode handler, one segment at a time (the CPU module's kernels,
// cpu/quant_kernels.h). Segments start on whole blocks, so every block codes as it does in the
// whole row; a segment's payload is the row layout of its own blocks (their scales, then their
// codes), so the decoded values are the row's. float32 and bfloat16 only (`supports`).
class QuantSegments final : public SegmentCodec {
 public:
  QuantSegments(int bits, uint64_t block, bool rotate, quant::Kernel kernel)
      : bits_(bits), block_(block), rotate_(rotate), kernel_(kernel) {}
  static bool supports(Elem e) { return e == Elem::kF32 || e == Elem::kBF16; }
  uint64_t align() const override { return block_; }
  uint64_t capacity(uint64_t count) const override;
  bool may_send_raw() const override { return false; }
  Result encode(const void* src, Elem e, uint64_t count, uint8_t* out, uint64_t* bytes) override;
  bool decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) override;
  bool decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw, int parts,
                  Elem e, uint64_t count, void* dst) override;

 private:
  int bits_;
  uint64_t block_;
  bool rotate_;
  quant::Kernel kernel_;
  std::vector<uint8_t> pieces_;  // decode_sum's payloads, side by side as the kernel takes them
};

}  // namespace mpi
}  // namespace jaxhc
