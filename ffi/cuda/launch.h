// Host helpers of the CUDA handlers: grid sizes, FFI errors, the element-type switch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/floats.h"
#include "xla/ffi/api/ffi.h"

namespace jaxhc {
namespace cuda {

constexpr int kThreads = 256;

// Blocks of kThreads for `items` work items; kernels loop over the rest (grid-stride).
inline unsigned grid_for(uint64_t items) {
  uint64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (1u << 20) ? blocks : (1u << 20));
}

inline xla::ffi::Error invalid(const char* op, const std::string& msg) {
  return xla::ffi::Error::InvalidArgument(std::string(op) + ": " + msg);
}

// The handler's result after its launches: the last CUDA error, if any, names the op.
inline xla::ffi::Error launched(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return xla::ffi::Error::Success();
  return xla::ffi::Error(xla::ffi::ErrorCode::kInternal,
                         std::string(op) + ": " + cudaGetErrorString(err));
}

// Calls fn(T{}) with T the element type of t (float, Bf16, F16, and double when kF64); false for
// the others.
template <bool kF64, typename Fn>
bool with_elem(xla::ffi::DataType t, Fn&& fn) {
  switch (t) {
    case xla::ffi::DataType::F32: fn(float{}); return true;
    case xla::ffi::DataType::F64:
      if constexpr (kF64) {
        fn(double{});
        return true;
      }
      return false;
    case xla::ffi::DataType::BF16: fn(Bf16{}); return true;
    case xla::ffi::DataType::F16: fn(F16{}); return true;
    default: return false;
  }
}

}  // namespace cuda
}  // namespace jaxhc
