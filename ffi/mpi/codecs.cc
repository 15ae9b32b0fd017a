#include "mpi/codecs.h"

#include <algorithm>
#include <cstring>

#include "core/mpc.h"
#include "core/quant_rotated.h"
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

namespace {
quant::Elem quant_elem(Elem e) { return e == Elem::kBF16 ? quant::Elem::kBF16 : quant::Elem::kF32; }
}  // namespace

uint64_t QuantSegments::capacity(uint64_t count) const {
  return quant::payload_bytes(count, bits_, block_, rotate_);
}

// The kernels run in the calling thread's floating-point mode; FTZ and DAZ, as XLA:CPU runs the
// unfused path's calls (only decode_sum's adds can meet a denormal: core/quant.h).
SegmentCodec::Result QuantSegments::encode(const void* src, Elem e, uint64_t count, uint8_t* out,
                                           uint64_t* bytes) {
  *bytes = capacity(count);
  bool ok = false;
  FlushDenormals ftz;
  if (rotate_)
    quant::encode_rotated_rows(kernel_, src, quant_elem(e), 1, count, bits_, block_, out, &ok);
  else
    quant::encode_rows(kernel_, src, quant_elem(e), 1, count, bits_, block_, quant::Rounding{},
                       out, &ok);
  return ok ? kCoded : kFail;  // NaN/Inf (rotated: also >= 2^116) never travel coded
}

bool QuantSegments::decode(const uint8_t* in, uint64_t bytes, Elem e, uint64_t count, void* dst) {
  return decode_sum(&in, &bytes, nullptr, 1, e, count, dst);
}

bool QuantSegments::decode_sum(const uint8_t* const* in, const uint64_t* bytes, const bool* raw,
                               int parts, Elem e, uint64_t count, void* dst) {
  const uint64_t cap = capacity(count);
  const uint8_t* payloads = in[0];
  if (parts > 1 && pieces_.size() < parts * cap) pieces_.resize(parts * cap);
  for (int p = 0; p < parts; ++p) {
    if ((raw && raw[p]) || bytes[p] != cap) return false;  // quant pieces are never raw
    if (parts > 1) std::memcpy(pieces_.data() + p * cap, in[p], cap);
  }
  if (parts > 1) payloads = pieces_.data();
  FlushDenormals ftz;
  auto rows = rotate_ ? quant::decode_sum_rotated_rows : quant::decode_sum_rows;
  rows(kernel_, payloads, parts, quant_elem(e), 1, count, bits_, block_, dst);
  return true;
}

}  // namespace mpi
}  // namespace jaxhc
