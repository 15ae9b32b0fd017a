// CPU handlers of the ZFP fixed-rate codec (contracts in cpu/handlers.h), on the kernels of
// cpu/zfp_kernels.h.
#include <stdexcept>
#include <string>

#include "core/ffi_args.h"
#include "core/zfp.h"
#include "cpu/handlers.h"
#include "cpu/zfp_kernels.h"

namespace ffi = xla::ffi;

namespace {

using jaxhc::zfp::Elem;
using jaxhc::zfp::Kernel;
using jaxhc::zfp::Rows;

ffi::Error invalid(const char* op, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + msg);
}

// The element type of a value buffer, or false for one ZFP does not take.
bool elem_of(ffi::DataType t, Elem* e) {
  switch (t) {
    case ffi::DataType::F32: *e = Elem::kF32; return true;
    case ffi::DataType::F64: *e = Elem::kF64; return true;
    case ffi::DataType::BF16: *e = Elem::kBF16; return true;
    case ffi::DataType::F16: *e = Elem::kF16; return true;
    default: return false;
  }
}

constexpr const char* kTypes = "values must be float32, float64, bfloat16 or float16";

// The checks of each handler for the stream's coded type (float64 for F64, else float32).
template <typename Check>
std::string check(Elem e, Check&& fn) {
  return e == Elem::kF64 ? fn(double{}) : fn(float{});
}

ffi::Error kernel(const char* op, Kernel* k) {
  try {
    *k = jaxhc::zfp::active_kernel();
  } catch (const std::invalid_argument& e) {
    return invalid(op, e.what());
  }
  return ffi::Error::Success();
}

ffi::Error ZfpEncode(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                     ffi::Result<ffi::AnyBuffer> finite, int64_t maxbits, int64_t dims) {
  const char* op = "jaxhc_zfp_encode";
  Elem e;
  if (!elem_of(x.element_type(), &e)) return invalid(op, kTypes);
  Rows r;
  std::string err = check(e, [&](auto s) {
    return jaxhc::zfp::check_encode_args<decltype(s)>(x, *payload, *finite, maxbits, dims, &r);
  });
  if (!err.empty()) return invalid(op, err);
  Kernel k;
  if (ffi::Error ke = kernel(op, &k); ke.failure()) return ke;
  jaxhc::zfp::encode_rows(k, x.untyped_data(), e, r.rows, r.n, static_cast<int>(maxbits),
                          static_cast<int>(dims), static_cast<uint64_t*>(payload->untyped_data()),
                          static_cast<bool*>(finite->untyped_data()));
  return ffi::Error::Success();
}

ffi::Error ZfpDecode(ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x, int64_t maxbits,
                     int64_t dims) {
  const char* op = "jaxhc_zfp_decode";
  Elem e;
  if (!elem_of(x->element_type(), &e)) return invalid(op, kTypes);
  Rows r;
  std::string err = check(e, [&](auto s) {
    return jaxhc::zfp::check_decode_args<decltype(s)>(payload, *x, maxbits, dims, &r);
  });
  if (!err.empty()) return invalid(op, err);
  Kernel k;
  if (ffi::Error ke = kernel(op, &k); ke.failure()) return ke;
  jaxhc::zfp::decode_rows(k, static_cast<const uint64_t*>(payload.untyped_data()), e, r.rows, r.n,
                          static_cast<int>(maxbits), static_cast<int>(dims), x->untyped_data());
  return ffi::Error::Success();
}

ffi::Error ZfpDecodeSum(ffi::AnyBuffer payloads, ffi::Result<ffi::AnyBuffer> x, int64_t maxbits,
                        int64_t dims) {
  const char* op = "jaxhc_zfp_decode_sum";
  Elem e;
  if (!elem_of(x->element_type(), &e)) return invalid(op, kTypes);
  Rows r;
  uint64_t parts = 0;
  std::string err = check(e, [&](auto s) {
    return jaxhc::zfp::check_decode_sum_args<decltype(s)>(payloads, *x, maxbits, dims, &r, &parts);
  });
  if (!err.empty()) return invalid(op, err);
  Kernel k;
  if (ffi::Error ke = kernel(op, &k); ke.failure()) return ke;
  jaxhc::zfp::decode_sum_rows(k, static_cast<const uint64_t*>(payloads.untyped_data()),
                              static_cast<int>(parts), e, r.rows, r.n, static_cast<int>(maxbits),
                              static_cast<int>(dims), x->untyped_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpEncodeCpu, ZfpEncode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits")
                                  .Attr<int64_t>("dims"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeCpu, ZfpDecode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits")
                                  .Attr<int64_t>("dims"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeSumCpu, ZfpDecodeSum,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits")
                                  .Attr<int64_t>("dims"));
