// CUDA handlers of the ZFP fixed-rate codec: the core of ffi/core/zfp.h compiled for the device,
// run on XLA's stream with no allocation and no synchronization (contracts in cpu/handlers.h).
//
// Encode runs one thread per 64-bit word of the stream: the thread codes every block that has
// bits in its word (one block codes into a local buffer, then its slice is shifted into place) and
// stores the word once. Nothing is shared between threads, so no atomics and no zeroing pass are
// needed, the padding comes out zero, and coalesced reads and writes follow from consecutive
// threads taking consecutive words. A block spanning w words is coded w times: always once at
// float32 rates 8 and 16, 1 + (maxbits - 1) / 64 times on average otherwise.
// 2-D/3-D rows (core/zfp_nd.h: blocks of 16 or 64 values, 512 bits and more at useful rates)
// encode one thread per block instead: after a zeroing pass it stores the words the block covers
// whole and ORs (atomically) its bits into the two words it may share with its neighbours.
// Decode runs one thread per block: it copies the block's bits out of the stream and writes its
// (up to) 4^dims values; decode-and-sum does the same for the block of each of the P payloads in
// turn, adding as it goes. bfloat16/float16 values are widened and narrowed in the kernels
// (core/floats.h).
#include <cuda_runtime.h>

#include <string>
#include <type_traits>
#include <utility>

#include "core/ffi_args.h"
#include "core/zfp.h"
#include "core/zfp_nd.h"
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

template <int D, typename T>
__global__ void encode_nd_kernel(const T* x, uint64_t* payload, bool* finite, Rows r, int maxbits) {
  using Scalar = typename jaxhc::Elems<T>::Coded;
  constexpr int S = jaxhc::zfp::block_values(D), W = jaxhc::zfp::kBlockWords<D, Scalar>;
  const uint64_t words = r.bytes / 8, blocks = (r.n + S - 1) / S;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * blocks; t += stride) {
    uint64_t row = t / blocks, b = t % blocks;
    Scalar v[S];
    jaxhc::zfp::load_block_nd<D>(x + row * r.n, r.n, b, v);
    jaxhc::zfp::BlockBits<W> bits;
    if (!jaxhc::zfp::encode_block_nd<D>(v, maxbits, bits)) finite[row] = false;
    uint64_t pos = b * static_cast<uint64_t>(maxbits);
    uint64_t* out = payload + row * words + pos / 64;
    int s = static_cast<int>(pos & 63), touched = (s + maxbits + 63) / 64;
    for (int i = 0; i < touched; i++) {  // word i holds the block's bits [64 i - s, 64 i - s + 64)
      uint64_t w = s ? (i < W ? bits.w[i] << s : 0) | (i ? bits.w[i - 1] >> (64 - s) : 0)
                     : bits.w[i];
      if (64 * i >= s && 64 * i + 64 <= s + maxbits)
        out[i] = w;
      else
        atomicOr(reinterpret_cast<unsigned long long*>(out + i), static_cast<unsigned long long>(w));
    }
  }
}

// The coded values of block b of a row's stream.
template <int D, typename Scalar>
__device__ void decode_at(const uint64_t* row, uint64_t words, uint64_t b, int maxbits, Scalar* v) {
  uint64_t in[jaxhc::zfp::kBlockWords<D, Scalar>];
  jaxhc::zfp::load_block_bits(row, words, b, maxbits, in);
  jaxhc::zfp::decode_block_d<D>(in, maxbits, v);
}

template <int D, typename T>
__global__ void decode_kernel(const uint64_t* payload, T* x, Rows r, int maxbits) {
  using E = jaxhc::Elems<T>;
  constexpr int S = jaxhc::zfp::block_values(D);
  const uint64_t words = r.bytes / 8, blocks = (r.n + S - 1) / S;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * blocks; t += stride) {
    uint64_t row = t / blocks, b = t % blocks;
    typename E::Coded v[S];
    decode_at<D>(payload + row * words, words, b, maxbits, v);
    T* out = x + row * r.n + S * b;
    uint64_t m = r.n - S * b;
    for (int i = 0; i < S && static_cast<uint64_t>(i) < m; i++) out[i] = E::narrow(v[i]);
  }
}

// payload: r.rows x parts payloads; each value rounded to T before it is added.
template <int D, typename T>
__global__ void decode_sum_kernel(const uint64_t* payload, uint64_t parts, T* x, Rows r,
                                  int maxbits) {
  using E = jaxhc::Elems<T>;
  constexpr int S = jaxhc::zfp::block_values(D);
  const uint64_t words = r.bytes / 8, blocks = (r.n + S - 1) / S;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * blocks; t += stride) {
    uint64_t row = t / blocks, b = t % blocks;
    typename E::Coded acc[S], v[S];
    for (uint64_t p = 0; p < parts; p++) {
      decode_at<D>(payload + (row * parts + p) * words, words, b, maxbits, v);
      for (int i = 0; i < S; i++) {
        auto rounded = E::widen(E::narrow(v[i]));
        acc[i] = p ? acc[i] + rounded : rounded;
      }
    }
    T* out = x + row * r.n + S * b;
    uint64_t m = r.n - S * b;
    for (int i = 0; i < S && static_cast<uint64_t>(i) < m; i++) out[i] = E::narrow(acc[i]);
  }
}

// Calls fn(std::integral_constant<int, D>{}) for dims D = 1, 2 or 3 (checked before).
template <typename Fn>
void with_dims(int64_t dims, Fn&& fn) {
  if (dims == 3)
    fn(std::integral_constant<int, 3>{});
  else if (dims == 2)
    fn(std::integral_constant<int, 2>{});
  else
    fn(std::integral_constant<int, 1>{});
}

constexpr const char* kTypes = "values must be float32, float64, bfloat16 or float16";

ffi::Error ZfpEncode(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                     ffi::Result<ffi::AnyBuffer> finite, int64_t maxbits, int64_t dims) {
  const char* op = "jaxhc_zfp_encode";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<true>(x.element_type(), [&](auto t) {
    using T = decltype(t);
    using Scalar = typename jaxhc::Elems<T>::Coded;
    Rows r;
    std::string err =
        jaxhc::zfp::check_encode_args<Scalar>(x, *payload, *finite, maxbits, dims, &r);
    if (!err.empty()) return void(result = invalid(op, err));
    if (cudaMemsetAsync(finite->untyped_data(), 1, r.rows, stream) != cudaSuccess)
      return void(result = launched(op));
    auto* words = static_cast<uint64_t*>(payload->untyped_data());
    auto* ok = static_cast<bool*>(finite->untyped_data());
    const T* values = static_cast<const T*>(x.untyped_data());
    if (dims == 1) {
      uint64_t items = r.rows * (r.bytes / 8);
      if (items)
        encode_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(values, words, ok, r,
                                                                   static_cast<int>(maxbits));
      return void(result = launched(op));
    }
    if (cudaMemsetAsync(words, 0, r.rows * r.bytes, stream) != cudaSuccess)
      return void(result = launched(op));
    with_dims(dims, [&](auto d) {
      constexpr int D = decltype(d)::value, S = jaxhc::zfp::block_values(D);
      uint64_t items = r.rows * ((r.n + S - 1) / S);
      if constexpr (D > 1)
        if (items)
          encode_nd_kernel<D, T><<<grid_for(items), kThreads, 0, stream>>>(
              values, words, ok, r, static_cast<int>(maxbits));
    });
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error ZfpDecode(cudaStream_t stream, ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                     int64_t maxbits, int64_t dims) {
  const char* op = "jaxhc_zfp_decode";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<true>(x->element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    std::string err = jaxhc::zfp::check_decode_args<typename jaxhc::Elems<T>::Coded>(
        payload, *x, maxbits, dims, &r);
    if (!err.empty()) return void(result = invalid(op, err));
    with_dims(dims, [&](auto d) {
      constexpr int D = decltype(d)::value, S = jaxhc::zfp::block_values(D);
      uint64_t items = r.rows * ((r.n + S - 1) / S);
      if (items)
        decode_kernel<D, T><<<grid_for(items), kThreads, 0, stream>>>(
            static_cast<const uint64_t*>(payload.untyped_data()),
            static_cast<T*>(x->untyped_data()), r, static_cast<int>(maxbits));
    });
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error ZfpDecodeSum(cudaStream_t stream, ffi::AnyBuffer payloads,
                        ffi::Result<ffi::AnyBuffer> x, int64_t maxbits, int64_t dims) {
  const char* op = "jaxhc_zfp_decode_sum";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<true>(x->element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    uint64_t parts = 0;
    std::string err = jaxhc::zfp::check_decode_sum_args<typename jaxhc::Elems<T>::Coded>(
        payloads, *x, maxbits, dims, &r, &parts);
    if (!err.empty()) return void(result = invalid(op, err));
    with_dims(dims, [&](auto d) {
      constexpr int D = decltype(d)::value, S = jaxhc::zfp::block_values(D);
      uint64_t items = r.rows * ((r.n + S - 1) / S);
      if (items)
        decode_sum_kernel<D, T><<<grid_for(items), kThreads, 0, stream>>>(
            static_cast<const uint64_t*>(payloads.untyped_data()), parts,
            static_cast<T*>(x->untyped_data()), r, static_cast<int>(maxbits));
    });
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
                                  .Attr<int64_t>("maxbits")
                                  .Attr<int64_t>("dims"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeCuda, ZfpDecode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits")
                                  .Attr<int64_t>("dims"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeSumCuda, ZfpDecodeSum,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits")
                                  .Attr<int64_t>("dims"));
