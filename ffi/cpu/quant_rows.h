// The rows of the CPU block-quantization kernels (cpu/quant_kernels.cc, cpu/quant_rotated.cc):
// a row's payload layout (core/quant.h, core/quant_rotated.h), the loop over its blocks on the
// codec thread pool, and the element-type switch.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/quant_rotated.h"
#include "cpu/fp_mode.h"
#include "cpu/parallel.h"
#include "cpu/quant_kernels.h"

namespace jaxhc {
namespace quant {

// A row's layout: scales, then the codes of each block (a rotated block codes all `block` values,
// its padding included).
struct Row {
  uint64_t n, block, blocks, bytes;
  int bits;
  Row(uint64_t n_, int bits_, uint64_t block_, bool rotate)
      : n(n_),
        block(block_),
        blocks(blocks_of(n_, block_)),
        bytes(payload_bytes(n_, bits_, block_, rotate)),
        bits(bits_) {}
  uint64_t size(uint64_t k) const { return std::min(block, n - k * block); }
  uint8_t* codes(uint8_t* p) const { return p + 4 * blocks; }
  const uint8_t* codes(const uint8_t* p) const { return p + 4 * blocks; }
  uint64_t code_offset(uint64_t k) const { return k * block * bits / 8; }
  // Bytes of the payload before its zero padding.
  uint64_t used(bool rotate) const {
    return 4 * blocks + (rotate ? blocks * block * bits / 8 : code_bytes(n, bits));
  }
};

// Calls fn(row, block) for every block of `rows` rows, split over the pool (caller's FP mode).
template <typename Fn>
void for_blocks(uint64_t rows, const Row& r, Fn&& fn) {
  const uint64_t grain = std::max<uint64_t>(1, (uint64_t{1} << 16) / r.block);
  const FpMode mode;
  parallel_for(rows * r.blocks, grain, [&](size_t g0, size_t g1) {
    mode.run([&] {
      for (size_t g = g0; g < g1; g++) fn(g / r.blocks, g % r.blocks);
    });
  });
}

template <typename Fn>
void with_elem(Elem e, Fn&& fn) {
  switch (e) {
    case Elem::kF32: return fn(float{});
    case Elem::kBF16: return fn(Bf16{});
    default: return fn(F16{});
  }
}

}  // namespace quant
}  // namespace jaxhc
