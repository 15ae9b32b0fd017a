// CPU handlers of the block-quantization codecs q8/q4 and, rotated, q8:h/q4:h (contracts in
// cpu/handlers.h), on the kernels of cpu/quant_kernels.h.
#include <stdexcept>
#include <string>

#include "core/ffi_args.h"
#include "core/quant.h"
#include "cpu/handlers.h"
#include "cpu/quant_kernels.h"

namespace ffi = xla::ffi;

namespace {

using jaxhc::Rows;
using jaxhc::quant::Elem;
using jaxhc::quant::Kernel;

ffi::Error invalid(const char* op, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + msg);
}

bool elem_of(ffi::DataType t, Elem* e) {
  switch (t) {
    case ffi::DataType::F32: *e = Elem::kF32; return true;
    case ffi::DataType::BF16: *e = Elem::kBF16; return true;
    case ffi::DataType::F16: *e = Elem::kF16; return true;
    default: return false;
  }
}

constexpr const char* kTypes = "values must be float32, bfloat16 or float16";

ffi::Error kernel(const char* op, Kernel* k) {
  try {
    *k = jaxhc::quant::active_kernel();
  } catch (const std::invalid_argument& e) {
    return invalid(op, e.what());
  }
  return ffi::Error::Success();
}

ffi::Error QuantEncode(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                       ffi::Result<ffi::AnyBuffer> ok, int64_t bits, int64_t block,
                       int64_t rotate, int64_t stochastic, int64_t seed) {
  const char* op = "jaxhc_quant_encode";
  Elem e;
  if (!elem_of(x.element_type(), &e)) return invalid(op, kTypes);
  Rows r;
  jaxhc::quant::Rounding rnd;
  std::string err = jaxhc::quant::check_rounding(stochastic, seed, &rnd);
  if (err.empty() && rotate == 1 && rnd.stochastic)
    err = "stochastic rounding is not available for rotated blocks";
  if (err.empty())
    err = jaxhc::quant::check_encode_args(x, *payload, *ok, bits, block, rotate, &r);
  if (!err.empty()) return invalid(op, err);
  Kernel k;
  if (ffi::Error ke = kernel(op, &k); ke.failure()) return ke;
  if (rotate) {
    jaxhc::quant::encode_rotated_rows(k, x.untyped_data(), e, r.rows, r.n, static_cast<int>(bits),
                                      static_cast<uint64_t>(block),
                                      static_cast<uint8_t*>(payload->untyped_data()),
                                      static_cast<bool*>(ok->untyped_data()));
    return ffi::Error::Success();
  }
  jaxhc::quant::encode_rows(k, x.untyped_data(), e, r.rows, r.n, static_cast<int>(bits),
                            static_cast<uint64_t>(block), rnd,
                            static_cast<uint8_t*>(payload->untyped_data()),
                            static_cast<bool*>(ok->untyped_data()));
  return ffi::Error::Success();
}

ffi::Error Decode(const char* op, bool sum, ffi::AnyBuffer payload, ffi::AnyBuffer x, int64_t bits,
                  int64_t block, int64_t rotate) {
  Elem e;
  if (!elem_of(x.element_type(), &e)) return invalid(op, kTypes);
  Rows r;
  uint64_t parts = 1;
  std::string err =
      jaxhc::quant::check_decode_args(payload, x, sum, bits, block, rotate, &r, &parts);
  if (!err.empty()) return invalid(op, err);
  Kernel k;
  if (ffi::Error ke = kernel(op, &k); ke.failure()) return ke;
  auto rows = rotate ? jaxhc::quant::decode_sum_rotated_rows : jaxhc::quant::decode_sum_rows;
  rows(k, static_cast<const uint8_t*>(payload.untyped_data()),
                                static_cast<int>(parts), e, r.rows, r.n, static_cast<int>(bits),
                                static_cast<uint64_t>(block), x.untyped_data());
  return ffi::Error::Success();
}

ffi::Error QuantDecode(ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x, int64_t bits,
                       int64_t block, int64_t rotate) {
  return Decode("jaxhc_quant_decode", false, payload, *x, bits, block, rotate);
}

ffi::Error QuantDecodeSum(ffi::AnyBuffer payloads, ffi::Result<ffi::AnyBuffer> x, int64_t bits,
                          int64_t block, int64_t rotate) {
  return Decode("jaxhc_quant_decode_sum", true, payloads, *x, bits, block, rotate);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantEncodeCpu, QuantEncode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("block")
                                  .Attr<int64_t>("rotate")
                                  .Attr<int64_t>("stochastic")
                                  .Attr<int64_t>("seed"));

namespace {

// decode and decode_sum: payload(s) in, values out.
auto DecodeBinding() {
  return ffi::Ffi::Bind()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Attr<int64_t>("bits")
      .Attr<int64_t>("block")
      .Attr<int64_t>("rotate");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantDecodeCpu, QuantDecode, DecodeBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantDecodeSumCpu, QuantDecodeSum, DecodeBinding());
