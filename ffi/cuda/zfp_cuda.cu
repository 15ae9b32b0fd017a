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
// (up to) 4 values.
#include <cuda_runtime.h>

#include <string>

#include "core/ffi_args.h"
#include "core/zfp.h"
#include "cuda/handlers.h"

namespace ffi = xla::ffi;

namespace {

using jaxhc::zfp::Format;
using jaxhc::zfp::Rows;

constexpr int kThreads = 256;

unsigned grid_for(uint64_t items) {  // kernels loop over the rest (grid-stride)
  uint64_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (1u << 20) ? blocks : (1u << 20));
}

template <typename Scalar>
__global__ void encode_kernel(const Scalar* x, uint64_t* payload, bool* finite, Rows r,
                              int maxbits) {
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

template <typename Scalar>
__global__ void decode_kernel(const uint64_t* payload, Scalar* x, Rows r, int maxbits) {
  const uint64_t words = r.bytes / 8, blocks = (r.n + 3) / 4;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < r.rows * blocks; t += stride) {
    uint64_t row = t / blocks, b = t % blocks;
    uint64_t in[Format<Scalar>::kWords];
    jaxhc::zfp::load_block_bits(payload + row * words, words, b, maxbits, in);
    Scalar v[4];
    jaxhc::zfp::decode_block(in, maxbits, v);
    Scalar* out = x + row * r.n + 4 * b;
    uint64_t m = r.n - 4 * b;
    for (int i = 0; i < 4 && static_cast<uint64_t>(i) < m; i++) out[i] = v[i];
  }
}

ffi::Error invalid(const char* op, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + msg);
}

ffi::Error launched(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(op) + ": " + cudaGetErrorString(err));
}

template <typename Scalar>
ffi::Error encode_typed(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer payload,
                        ffi::AnyBuffer finite, int64_t maxbits) {
  const char* op = "jaxhc_zfp_encode";
  Rows r;
  std::string err = jaxhc::zfp::check_encode_args<Scalar>(x, payload, finite, maxbits, &r);
  if (!err.empty()) return invalid(op, err);
  if (cudaMemsetAsync(finite.untyped_data(), 1, r.rows, stream) != cudaSuccess) return launched(op);
  uint64_t items = r.rows * (r.bytes / 8);
  if (items)
    encode_kernel<Scalar><<<grid_for(items), kThreads, 0, stream>>>(
        static_cast<const Scalar*>(x.untyped_data()),
        static_cast<uint64_t*>(payload.untyped_data()),
        static_cast<bool*>(finite.untyped_data()), r, static_cast<int>(maxbits));
  return launched(op);
}

template <typename Scalar>
ffi::Error decode_typed(cudaStream_t stream, ffi::AnyBuffer payload, ffi::AnyBuffer x,
                        int64_t maxbits) {
  const char* op = "jaxhc_zfp_decode";
  Rows r;
  std::string err = jaxhc::zfp::check_decode_args<Scalar>(payload, x, maxbits, &r);
  if (!err.empty()) return invalid(op, err);
  uint64_t items = r.rows * ((r.n + 3) / 4);
  if (items)
    decode_kernel<Scalar><<<grid_for(items), kThreads, 0, stream>>>(
        static_cast<const uint64_t*>(payload.untyped_data()),
        static_cast<Scalar*>(x.untyped_data()), r, static_cast<int>(maxbits));
  return launched(op);
}

ffi::Error ZfpEncode(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                     ffi::Result<ffi::AnyBuffer> finite, int64_t maxbits) {
  switch (x.element_type()) {
    case ffi::DataType::F32:
      return encode_typed<float>(stream, x, *payload, *finite, maxbits);
    case ffi::DataType::F64:
      return encode_typed<double>(stream, x, *payload, *finite, maxbits);
    default:
      return invalid("jaxhc_zfp_encode", "values must be float32 or float64");
  }
}

ffi::Error ZfpDecode(cudaStream_t stream, ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                     int64_t maxbits) {
  switch (x->element_type()) {
    case ffi::DataType::F32:
      return decode_typed<float>(stream, payload, *x, maxbits);
    case ffi::DataType::F64:
      return decode_typed<double>(stream, payload, *x, maxbits);
    default:
      return invalid("jaxhc_zfp_decode", "values must be float32 or float64");
  }
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
