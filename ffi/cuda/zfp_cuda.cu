// CUDA handlers of the ZFP fixed-rate codec: the core of ffi/core/zfp.h compiled for the device,
// run on XLA's stream with no allocation and no synchronization (contracts in cpu/handlers.h).
//
// Encode runs one thread per 64-bit word of the stream: the thread codes every block that has
// bits in its word (one block codes into a local buffer, then its slice is shifted into place) and
// stores the word once. Nothing is shared between threads, so no atomics and no zeroing pass are
// needed, the padding comes out zero, and coalesced reads and writes follow from consecutive
// threads taking consecutive words. A block spanning w words is coded w times: always once at
// float32 rates 8 and 16, 1 + (maxbits - 1) / 64 times on average otherwise.
// Decode runs one thread per block: it copies the block's bits out of the stream and writes its
// (up to) 4 values; decode-and-sum does the same for the block of each of the P payloads in turn,
// adding as it goes. bfloat16/float16 values are widened and narrowed in the kernels (core/floats.h).
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/ffi_args.h"
#include "core/zfp.h"
#include "cuda/handlers.h"
#include "cuda/launch.h"

namespace ffi = xla::ffi;

namespace {

using jaxhc::zfp::Format;
using jaxhc::zfp::Rows;

using jaxhc::cuda::grid_for;
using jaxhc::cuda::invalid;
using jaxhc::cuda::kThreads;
using jaxhc::cuda::launched;

template <typename T>
__global__ void encode_kernel(const T* x, uint64_t* payload, bool* finite, Rows r, int maxbits) {
  const uint64_t words = r.bytes / 8;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * words; t += stride) {
    uint64_t row = t / words;
    bool ok = true;
    uint64_t word = jaxhc::zfp::encode_word(x + row * r.n, r.n, maxbits, t % words, &ok);
    payload[t] = word;
    if (!ok) finite[row] = false;  // initialized to true; racing stores all write false
  }
}

// The coded values of block b of a row's stream.
template <typename Scalar>
__device__ void decode_at(const uint64_t* row, uint64_t words, uint64_t b, int maxbits, Scalar* v) {
  uint64_t in[Format<Scalar>::kWords];
  jaxhc::zfp::load_block_bits(row, words, b, maxbits, in);
  jaxhc::zfp::decode_block(in, maxbits, v);
}

template <typename T>
__global__ void decode_kernel(const uint64_t* payload, T* x, Rows r, int maxbits) {
  using E = jaxhc::Elems<T>;
  const uint64_t words = r.bytes / 8, blocks = (r.n + 3) / 4;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * blocks; t += stride) {
    uint64_t row = t / blocks, b = t % blocks;
    typename E::Coded v[4];
    decode_at(payload + row * words, words, b, maxbits, v);
    T* out = x + row * r.n + 4 * b;
    uint64_t m = r.n - 4 * b;
    for (int i = 0; i < 4 && static_cast<uint64_t>(i) < m; i++) out[i] = E::narrow(v[i]);
  }
}

// payload: r.rows x parts payloads; each value rounded to T before it is added.
template <typename T>
__global__ void decode_sum_kernel(const uint64_t* payload, uint64_t parts, T* x, Rows r,
                                  int maxbits) {
  using E = jaxhc::Elems<T>;
  const uint64_t words = r.bytes / 8, blocks = (r.n + 3) / 4;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * blocks; t += stride) {
    uint64_t row = t / blocks, b = t % blocks;
    typename E::Coded acc[4], v[4];
    for (uint64_t p = 0; p < parts; p++) {
      decode_at(payload + (row * parts + p) * words, words, b, maxbits, v);
      for (int i = 0; i < 4; i++) {
        auto rounded = E::widen(E::narrow(v[i]));
        acc[i] = p ? acc[i] + rounded : rounded;
      }
    }
    T* out = x + row * r.n + 4 * b;
    uint64_t m = r.n - 4 * b;
    for (int i = 0; i < 4 && static_cast<uint64_t>(i) < m; i++) out[i] = E::narrow(acc[i]);
  }
}

constexpr const char* kTypes = "values must be float32, float64, bfloat16 or float16";

ffi::Error ZfpEncode(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                     ffi::Result<ffi::AnyBuffer> finite, int64_t maxbits) {
  const char* op = "jaxhc_zfp_encode";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<true>(x.element_type(), [&](auto t) {
    using T = decltype(t);
    using Scalar = typename jaxhc::Elems<T>::Coded;
    Rows r;
    std::string err = jaxhc::zfp::check_encode_args<Scalar>(x, *payload, *finite, maxbits, &r);
    if (!err.empty()) return void(result = invalid(op, err));
    if (cudaMemsetAsync(finite->untyped_data(), 1, r.rows, stream) != cudaSuccess)
      return void(result = launched(op));
    uint64_t items = r.rows * (r.bytes / 8);
    if (items)
      encode_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(
          static_cast<const T*>(x.untyped_data()), static_cast<uint64_t*>(payload->untyped_data()),
          static_cast<bool*>(finite->untyped_data()), r, static_cast<int>(maxbits));
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error ZfpDecode(cudaStream_t stream, ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                     int64_t maxbits) {
  const char* op = "jaxhc_zfp_decode";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<true>(x->element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    std::string err = jaxhc::zfp::check_decode_args<typename jaxhc::Elems<T>::Coded>(
        payload, *x, maxbits, &r);
    if (!err.empty()) return void(result = invalid(op, err));
    uint64_t items = r.rows * ((r.n + 3) / 4);
    if (items)
      decode_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(
          static_cast<const uint64_t*>(payload.untyped_data()), static_cast<T*>(x->untyped_data()),
          r, static_cast<int>(maxbits));
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error ZfpDecodeSum(cudaStream_t stream, ffi::AnyBuffer payloads,
                        ffi::Result<ffi::AnyBuffer> x, int64_t maxbits) {
  const char* op = "jaxhc_zfp_decode_sum";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<true>(x->element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    uint64_t parts = 0;
    std::string err = jaxhc::zfp::check_decode_sum_args<typename jaxhc::Elems<T>::Coded>(
        payloads, *x, maxbits, &r, &parts);
    if (!err.empty()) return void(result = invalid(op, err));
    uint64_t items = r.rows * ((r.n + 3) / 4);
    if (items)
      decode_sum_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(
          static_cast<const uint64_t*>(payloads.untyped_data()), parts,
          static_cast<T*>(x->untyped_data()), r, static_cast<int>(maxbits));
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpEncodeCuda, ZfpEncode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeCuda, ZfpDecode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeSumCuda, ZfpDecodeSum,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits"));
