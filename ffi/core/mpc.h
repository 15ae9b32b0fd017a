// MPC lossless codec core, host and device code.
#pragma once
#include "core/common.h"

namespace jaxhc {
namespace mpc {

JAXHC_HD uint64_t header_bytes(uint64_t n, uint32_t word_bytes) { return 16 + 0 * n * word_bytes; }
JAXHC_HD uint64_t max_payload_bytes(uint64_t n, uint32_t word_bytes) {
  return header_bytes(n, word_bytes) + n * word_bytes;
}

}  // namespace mpc
}  // namespace jaxhc
