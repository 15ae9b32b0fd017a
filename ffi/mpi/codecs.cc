#include "mpi/codecs.h"

#include <algorithm>
#include <cstring>

#include "core/mpc.h"
#include "core/zfp.h"
#include "cpu/handlers.h"
#include "cpu/zfp_kernels.h"
#include "mpi/values.h"

namespace jaxhc {
namespace mpi {

namespace {
zfp::Elem zfp_elem(Elem e) {
  return e == Elem::kF64 ? zfp::Elem::kF64 : e == Elem::kBF16 ? zfp::Elem::kBF16 : zfp::Elem::kF32;
}
}  // namespace

uint64_t ZfpSegments::capacity(uint64_t count) const {
  return zfp::payload_bytes(count, static_cast<uint32_t>(maxbits_), dims_);
}

SegmentCodec::Result ZfpSegments::encode(const void* src, Elem e, uint64_t count, uint8_t* out,
                                         uint64_t* bytes) {
  *bytes = capacity(count);
  bool finite =
      zfp::encode_row(src, zfp_elem(e), count, maxbits_, dims_, reinterpret_cast<uint64_t*>(out));
  return finite ? kCoded : kFail;
}

bool ZfpSegments::decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) {
  if (bytes != capacity(count)) return false;
  zfp::decode_row(reinterpret_cast<const uint64_t*>(in), zfp_elem(e), count, maxbits_, dims_, dst);
  return true;
}

bool ZfpSegments::decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw,
                             int parts, Elem e, uint64_t count, void* dst) {
  std::vector<const uint64_t*> payloads(parts);
  for (int p = 0; p < parts; ++p) {
    if (raw[p] || bytes[p] != capacity(count)) return false;  // ZFP pieces are never raw
    payloads[p] = reinterpret_cast<const uint64_t*>(in[p]);
  }
  FlushDenormals ftz;  // the kernel adds in the calling thread's mode, as XLA:CPU would
  zfp::decode_sum(payloads.data(), parts, zfp_elem(e), count, maxbits_, dims_, dst);
  return true;
}

uint64_t MpcSegments::capacity_for(uint64_t count, uint32_t wb) const {
  uint64_t raw = count * wb, head = mpc::header_bytes(count, wb);
  uint64_t cap = raw / 8 * 8;  // coded only when smaller than raw
  if (budget_ > 0) cap = std::min<uint64_t>(cap, static_cast<uint64_t>(budget_ * raw) / 8 * 8);
  return std::max(cap, mpc::align_up(head, 8));
}

SegmentCodec::Result MpcSegments::encode(const void* src, Elem e, uint64_t count, uint8_t* out,
                                         uint64_t* bytes) {
  const uint32_t wb = static_cast<uint32_t>(elem_bytes(e));
  const uint64_t cap = capacity_for(count, wb);
  uint64_t used = mpc::encode_host(src, wb, count, static_cast<uint32_t>(dim_), out, cap);
  if (budget_ > 0 && used > std::max(mpc::align_up(mpc::header_bytes(count, wb), 8),
                                     static_cast<uint64_t>(budget_ * count * wb) / 8 * 8))
    return kOverBudget;  // as the unfused collectives count it (per segment here)
  if (used > cap || used >= count * wb) return kRaw;
  *bytes = used;
  return kCoded;
}

bool MpcSegments::decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) {
  const uint32_t wb = static_cast<uint32_t>(elem_bytes(e));
  return mpc::decode_host(in, bytes, wb, count, static_cast<uint32_t>(dim_), dst) == 0;
}

bool MpcSegments::decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw,
                             int parts, Elem e, uint64_t count, void* dst) {
  const size_t eb = elem_bytes(e);
  if (pieces_.size() < parts * count * eb) pieces_.resize(parts * count * eb);
  std::vector<const void*> values(parts);
  for (int p = 0; p < parts; ++p) {
    if (raw[p]) {
      values[p] = in[p];
      continue;
    }
    uint8_t* v = pieces_.data() + p * count * eb;
    if (!decode(in[p], bytes[p], e, count, v)) return false;
    values[p] = v;
  }
  sum_in_rank_order(values.data(), parts, e, count, dst);
  return true;
}

}  // namespace mpi
}  // namespace jaxhc
