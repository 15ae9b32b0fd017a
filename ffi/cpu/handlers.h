// XLA FFI handler symbols of the CPU module (one definition each in zfp_cpu.cc / mpc_cpu.cc).
//
// Buffer contracts (shared with the CUDA module and with jaxhc/codecs/*.py). Every operand carries
// optional leading batch dimensions (vmap uses "broadcast_all"); the last dimension is the item.
// Attributes arrive as int64 (jax.ffi.ffi_call passes Python ints as i64).
//   jaxhc_zfp_encode  x: F32|F64 [..., n]          attrs: maxbits (bits per 4-value block)
//                     -> payload: U8 [..., zfp_payload_bytes(n, maxbits)], finite: PRED [...]
//   jaxhc_zfp_decode  payload: U8 [..., bytes]      attrs: maxbits
//                     -> x: F32|F64 [..., n]
//   jaxhc_mpc_encode  x: U16|U32|U64 [..., n]      attrs: dim (>= 1)   (floats arrive bitcast)
//                     -> payload: U8 [..., capacity], nbytes: S32 [...]  (nbytes > capacity: over budget)
//   jaxhc_mpc_decode  payload: U8 [..., capacity]   attrs: dim
//                     -> x: U16|U32|U64 [..., n]     (malformed payload: an FFI error, never a crash)
#pragma once
#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpDecodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcMpcEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcMpcDecodeCpu);
