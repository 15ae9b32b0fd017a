// XLA FFI handler symbols of the CPU module (one definition each in zfp_cpu.cc / mpc_cpu.cc).
//
// Buffer contracts (shared with the CUDA module and with jaxhc/codecs/*.py). Every operand carries
// optional leading batch dimensions (vmap uses "broadcast_all"); the last dimension is the item.
// Attributes arrive as int64 (jax.ffi.ffi_call passes Python ints as i64).
//   jaxhc_zfp_encode  x: F32|F64|BF16|F16 [..., n]  attrs: maxbits (bits per block), dims (1, 2
//                     or 3: blocks of 4^dims values)
//                     -> payload: U8 [..., zfp_payload_bytes(n, maxbits, dims)], finite: PRED [...]
//                     BF16/F16 values are coded as their float32 widening (the float32 stream)
//   jaxhc_zfp_decode  payload: U8 [..., bytes]      attrs: maxbits, dims
//                     -> x: F32|F64|BF16|F16 [..., n]  (narrow types rounded as jnp.astype)
//   jaxhc_zfp_decode_sum  payloads: U8 [..., P, bytes]  attrs: maxbits, dims
//                     -> x: F32|F64|BF16|F16 [..., n]: the P decoded rows, each rounded to x's
//                        type, added in order 0..P-1 in float32 (float64 for F64), then rounded
//   jaxhc_quant_encode  x: F32|BF16|F16 [..., n]  attrs: bits (8 or 4), block (multiple of 8),
//                     stochastic (0: round to nearest even, 1: stochastic rounding), seed (0..2^32-1)
//                     -> payload: U8 [..., quant_payload_bytes(n, bits, block)], ok: PRED [...]
//                        (ok: every value finite; format in core/quant.h)
//   jaxhc_quant_decode  payload: U8 [..., bytes]  attrs: bits, block  -> x: F32|BF16|F16 [..., n]
//   jaxhc_quant_decode_sum  payloads: U8 [..., P, bytes]  attrs: bits, block
//                     -> x [..., n]: as jaxhc_zfp_decode_sum (rows rounded to x's type, added in
//                        order 0..P-1 in float32, rounded)
//   jaxhc_mpc_encode  x: W [..., n]                attrs: dim (1..64)
//                     W: any 16/32/64-bit int or float type; only its bits are coded
//                     -> payload: U8 [..., capacity], nbytes: S32 [...]  (nbytes > capacity: over budget),
//                        scratch: U8 [..., mpc_scratch_bytes(n)]  (the CUDA encoder's work space; its
//                        contents are garbage, the CPU encoder leaves it alone)
//                     capacity: a multiple of 8, at least mpc_header_bytes(n)
//   jaxhc_mpc_decode  payload: U8 [..., capacity]   attrs: dim, strict (0 or 1)
//                     -> x: W [..., n], status: S32 [...]  (0: ok, else mpc::Status)
//                     A malformed row decodes to zeros with a nonzero status, never a crash; with
//                     strict=1 the CPU handler also fails the call (FFI error naming the first bad row).
#pragma once
#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpDecodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcZfpDecodeSumCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcQuantEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcQuantDecodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcQuantDecodeSumCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcMpcEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxhcMpcDecodeCpu);

// Host entry points of the MPC kernels on plain buffers (one row of n words of wb bytes), for the
// fused MPI collectives (ZFP's are in cpu/zfp_kernels.h). encode: the payload's used bytes (more
// than `capacity`: over budget, payload cut).
// decode: 0, or the mpc::Status of a malformed row.
namespace jaxhc {
namespace mpc {
uint64_t encode_host(const void* x, uint32_t wb, uint64_t n, uint32_t dim, uint8_t* payload,
                     uint64_t capacity);
int32_t decode_host(const uint8_t* payload, uint64_t capacity, uint32_t wb, uint64_t n,
                    uint32_t dim, void* x);
}  // namespace mpc
}  // namespace jaxhc
