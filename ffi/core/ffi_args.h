// The handlers' argument checks, shared by the CPU and CUDA modules (host code on XLA FFI buffers;
// contracts in cpu/handlers.h). Each returns "" when the buffers fit, else what is wrong; the
// handler adds the op name and fails the call.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/mpc.h"
#include "core/quant.h"
#include "core/quant_rotated.h"
#include "core/rows.h"
#include "core/zfp.h"
#include "xla/ffi/api/ffi.h"

namespace jaxhc {

inline bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

namespace zfp {

template <typename Scalar>
std::string check_encode_args(xla::ffi::AnyBuffer x, xla::ffi::AnyBuffer payload,
                              xla::ffi::AnyBuffer finite, int64_t maxbits, int64_t dims,
                              Rows* r) {
  auto fdims = finite.dimensions();
  std::string err =
      check_rows<Scalar>(x.dimensions(), payload.dimensions(), &fdims, maxbits, dims, r);
  if (!err.empty()) return err;
  if (payload.element_type() != xla::ffi::DataType::U8 ||
      finite.element_type() != xla::ffi::DataType::PRED)
    return "results must be (uint8 payload, bool finite)";
  if (!aligned8(payload.untyped_data())) return "payload buffer is not 8-byte aligned";
  return "";
}

template <typename Scalar>
std::string check_decode_args(xla::ffi::AnyBuffer payload, xla::ffi::AnyBuffer x, int64_t maxbits,
                              int64_t dims, Rows* r) {
  std::string err = check_rows<Scalar>(
      x.dimensions(), payload.dimensions(),
      static_cast<const xla::ffi::AnyBuffer::Dimensions*>(nullptr), maxbits, dims, r);
  if (!err.empty()) return err;
  if (payload.element_type() != xla::ffi::DataType::U8) return "payload must be uint8";
  if (!aligned8(payload.untyped_data())) return "payload buffer is not 8-byte aligned";
  return "";
}

// Payloads [..., parts, bytes] summed into values [..., n] (jaxhc_zfp_decode_sum).
template <typename Scalar>
std::string check_decode_sum_args(xla::ffi::AnyBuffer payloads, xla::ffi::AnyBuffer x,
                                  int64_t maxbits, int64_t dims, Rows* r, uint64_t* parts) {
  std::vector<int64_t> rows, one;
  std::string err = split_sum_dims(payloads.dimensions(), x.dimensions(), &rows, &one, parts);
  if (err.empty())
    err = check_rows<Scalar>(one, rows, static_cast<const std::vector<int64_t>*>(nullptr), maxbits,
                             dims, r);
  if (!err.empty()) return err;
  if (payloads.element_type() != xla::ffi::DataType::U8) return "payloads must be uint8";
  if (!aligned8(payloads.untyped_data())) return "payloads buffer is not 8-byte aligned";
  return "";
}

}  // namespace zfp

namespace mpc {

// Only the bits are coded, so any 16/32/64-bit element type works (0: any other type); floats need
// no bitcast (which XLA:CPU would run as a copy).
inline uint32_t word_bytes(xla::ffi::DataType t) {
  using T = xla::ffi::DataType;
  switch (t) {
    case T::U16: case T::S16: case T::F16: case T::BF16: return 2;
    case T::U32: case T::S32: case T::F32: return 4;
    case T::U64: case T::S64: case T::F64: return 8;
    default: return 0;
  }
}

// A batch of items: rows (product of the leading dimensions) of n words of wb bytes, each coded
// into a payload row of `capacity` bytes.
struct Batch {
  uint64_t rows = 1, n = 0, capacity = 0;
  uint32_t wb = 0;
};

namespace detail {

// True when `b` has the leading dimensions of `a`, plus an item dimension when `item` is set.
inline bool same_batch(xla::ffi::AnyBuffer::Dimensions a, xla::ffi::AnyBuffer::Dimensions b,
                       bool item) {
  if (a.size() == 0 || b.size() != a.size() - (item ? 0 : 1)) return false;
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// The checks of values `x` against a payload and the dimensions of a per-row int32 output
// (`nbytes` or `status`, whose type the handler's binding fixes).
inline std::string check_common(xla::ffi::AnyBuffer x, xla::ffi::AnyBuffer payload,
                                xla::ffi::AnyBuffer::Dimensions per_row, const char* per_row_name,
                                int64_t dim, Batch* b) {
  auto xd = x.dimensions(), pd = payload.dimensions();
  if (xd.size() == 0 || pd.size() == 0) return "x and payload need an item dimension";
  *b = Batch{};
  for (size_t i = 0; i + 1 < xd.size(); ++i) b->rows *= uint64_t(xd[i]);
  b->n = uint64_t(xd.back());
  b->capacity = uint64_t(pd.back());
  b->wb = word_bytes(x.element_type());
  if (std::string why = check_sizes(b->n, b->wb, dim, b->capacity); !why.empty()) return why;
  if (payload.element_type() != xla::ffi::DataType::U8 || !same_batch(xd, pd, true))
    return "payload must be uint8 with the batch dimensions of x";
  if (!same_batch(xd, per_row, false))
    return std::string(per_row_name) + " must be int32 with the batch dimensions of x";
  return "";
}

}  // namespace detail

// `nbytes` and `scratch` are the dimensions of the int32 and uint8 results.
inline std::string check_encode_args(xla::ffi::AnyBuffer x, xla::ffi::AnyBuffer payload,
                                     xla::ffi::AnyBuffer::Dimensions nbytes,
                                     xla::ffi::AnyBuffer::Dimensions scratch, int64_t dim,
                                     Batch* b) {
  if (std::string why = detail::check_common(x, payload, nbytes, "nbytes", dim, b); !why.empty())
    return why;
  const uint64_t sbytes = scratch_bytes(b->n, b->wb);
  if (!detail::same_batch(x.dimensions(), scratch, true) || uint64_t(scratch.back()) != sbytes)
    return "scratch must be uint8[..., " + std::to_string(sbytes) + "]";
  return "";
}

// `status` is the dimensions of the int32 result.
inline std::string check_decode_args(xla::ffi::AnyBuffer payload, xla::ffi::AnyBuffer x,
                                     xla::ffi::AnyBuffer::Dimensions status, int64_t dim,
                                     Batch* b) {
  return detail::check_common(x, payload, status, "status", dim, b);
}

}  // namespace mpc
namespace quant {

// The encoder's rounding attributes: stochastic 0 or 1, seed 0..2^32-1.
inline std::string check_rounding(int64_t stochastic, int64_t seed, Rounding* rnd) {
  if (stochastic != 0 && stochastic != 1)
    return "stochastic " + std::to_string(stochastic) + " must be 0 or 1";
  if (seed < 0 || seed > int64_t{0xffffffff})
    return "seed " + std::to_string(seed) + " must be in 0..4294967295";
  rnd->stochastic = stochastic == 1;
  rnd->seed = static_cast<uint32_t>(seed);
  return "";
}

inline std::string check_params(int64_t bits, int64_t block, int64_t rotate) {
  if (!valid_bits(bits)) return "bits " + std::to_string(bits) + " must be 8 or 4";
  if (rotate != 0 && rotate != 1) return "rotate " + std::to_string(rotate) + " must be 0 or 1";
  if (rotate && !valid_rotated_block(block))
    return "block " + std::to_string(block) + " must be a power of two in " +
           std::to_string(1 << kMinLog2Block) + ".." + std::to_string(1 << kMaxLog2Block) +
           " (rotated)";
  if (!valid_block(block))
    return "block " + std::to_string(block) + " must be a multiple of 8 in 8.." +
           std::to_string(kMaxBlock);
  return "";
}

template <typename Dims>
std::string check_rows(const Dims& values, const Dims& payload, const Dims* flags, int64_t bits,
                       int64_t block, int64_t rotate, Rows* r) {
  if (std::string err = check_params(bits, block, rotate); !err.empty()) return err;
  auto bytes = [&](uint64_t n) { return payload_bytes(n, int(bits), uint64_t(block), rotate); };
  return check_row_shapes(values, payload, flags, bytes,
                          "at q" + std::to_string(bits) + " block " + std::to_string(block) +
                              (rotate ? " rotated" : ""),
                          r);
}

inline std::string check_encode_args(xla::ffi::AnyBuffer x, xla::ffi::AnyBuffer payload,
                                     xla::ffi::AnyBuffer ok, int64_t bits, int64_t block,
                                     int64_t rotate, Rows* r) {
  auto od = ok.dimensions();
  std::string err = check_rows(x.dimensions(), payload.dimensions(), &od, bits, block, rotate, r);
  if (!err.empty()) return err;
  if (payload.element_type() != xla::ffi::DataType::U8 ||
      ok.element_type() != xla::ffi::DataType::PRED)
    return "results must be (uint8 payload, bool ok)";
  if (!aligned8(payload.untyped_data())) return "payload buffer is not 8-byte aligned";
  return "";
}

// Payloads [..., parts, bytes] into values [..., n]; decode is parts = 1 without its dimension.
inline std::string check_decode_args(xla::ffi::AnyBuffer payloads, xla::ffi::AnyBuffer x,
                                     bool sum, int64_t bits, int64_t block, int64_t rotate,
                                     Rows* r, uint64_t* parts) {
  std::string err;
  *parts = 1;
  if (sum) {
    std::vector<int64_t> rows, one;
    err = split_sum_dims(payloads.dimensions(), x.dimensions(), &rows, &one, parts);
    if (err.empty())
      err = check_rows(one, rows, static_cast<const std::vector<int64_t>*>(nullptr), bits, block,
                       rotate, r);
  } else {
    err = check_rows(x.dimensions(), payloads.dimensions(),
                     static_cast<const xla::ffi::AnyBuffer::Dimensions*>(nullptr), bits, block,
                     rotate, r);
  }
  if (!err.empty()) return err;
  if (payloads.element_type() != xla::ffi::DataType::U8) return "payload must be uint8";
  if (!aligned8(payloads.untyped_data())) return "payload buffer is not 8-byte aligned";
  return "";
}

}  // namespace quant
}  // namespace jaxhc
