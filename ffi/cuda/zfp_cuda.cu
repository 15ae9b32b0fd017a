#include "cuda/handlers.h"
namespace ffi = xla::ffi;
static ffi::Error NotYet(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented, "not built yet");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpEncodeCuda, NotYet, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeCuda, NotYet, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
