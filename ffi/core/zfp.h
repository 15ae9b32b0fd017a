// ZFP fixed-rate 1-D codec core (float32/float64), host and device code.
#pragma once
#include "core/common.h"

namespace jaxhc {
namespace zfp {

// Bytes of the stream of n values at maxbits bits per 4-value block, padded to 64-bit words.
JAXHC_HD uint64_t payload_bytes(uint64_t n, uint32_t maxbits) {
  uint64_t bits = ((n + 3) / 4) * maxbits;
  return ((bits + 63) / 64) * 8;
}

}  // namespace zfp
}  // namespace jaxhc
