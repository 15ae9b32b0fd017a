#include "cpu/handlers.h"
namespace ffi = xla::ffi;
static ffi::Error NotYet(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented, "not built yet");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpEncodeCpu, NotYet, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeCpu, NotYet, ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
