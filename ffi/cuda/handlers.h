// XLA FFI handler symbols of the CUDA module: the same buffer contracts as ffi/cpu/handlers.h,
// run on the XLA stream (PlatformStream<cudaStream_t>); they allocate nothing and never synchronize.
// Handlers that need scratch memory take it as an extra result buffer sized by the Python wrapper.
#pragma once
#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpDecodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpDecodeSumCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcQuantEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcQuantDecodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcQuantDecodeSumCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcMpcEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcMpcDecodeCuda);
