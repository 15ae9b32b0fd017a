// CUDA handlers of the block-quantization codecs q8/q4: the arithmetic of ffi/core/quant.h on the
// device, run on XLA's stream with no allocation and no synchronization (contracts in
// cpu/handlers.h).
//
// Encode runs one warp per block: the lanes take the largest |x| bits of the block (a warp max),
// lane 0 stores the scale, and the lanes write the code bytes (one or two values each); the warp
// of a row's last block zeroes the padding (stochastic rounding: the draws of core/quant.h). Decode and decode-and-sum run one thread per value;
// decode-and-sum adds the P decoded values (each rounded to the output type first) in rank
// order. Products use __fmul_rn, which is never contracted into an FMA.
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/ffi_args.h"
#include "core/quant.h"
#include "cuda/handlers.h"
#include "cuda/launch.h"

namespace ffi = xla::ffi;

namespace {

using jaxhc::Rows;
namespace q = jaxhc::quant;

using jaxhc::cuda::grid_for;
using jaxhc::cuda::invalid;
using jaxhc::cuda::kThreads;
using jaxhc::cuda::launched;

struct Layout {
  Rows r;
  uint64_t block, blocks;
  int bits;
  q::Rounding rnd;
};

template <typename T>
__global__ void encode_kernel(const T* x, uint8_t* payload, bool* ok, Layout L) {
  using E = jaxhc::Elems<T>;
  const int lane = threadIdx.x % 32;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * blockDim.x / 32;
  for (uint64_t w = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
       w < L.r.rows * L.blocks; w += warps) {
    const uint64_t row = w / L.blocks, k = w % L.blocks, first = k * L.block;
    const uint64_t m = L.r.n - first < L.block ? L.r.n - first : L.block;
    const T* xb = x + row * L.r.n + first;
    uint32_t a = 0;
    for (uint64_t i = lane; i < m; i += 32) a = max(a, q::abs_bits(E::widen(xb[i])));
    for (int off = 16; off; off /= 2) a = max(a, __shfl_xor_sync(0xffffffffu, a, off));
    const q::Scale s = q::scale_of(a, L.bits);
    uint8_t* p = payload + row * L.r.bytes;
    if (lane == 0) {
      reinterpret_cast<float*>(p)[k] = s.scale;
      if (a >= q::kInfBits) ok[row] = false;  // initialized to true; racing stores all write false
    }
    uint8_t* codes = p + 4 * L.blocks + first * L.bits / 8;
    const uint64_t nbytes = q::code_bytes(m, L.bits);
    for (uint64_t j = lane; j < nbytes; j += 32) {
      int lo = 0, hi = 0;
      if (s.inv != 0.0f) {
        const uint64_t i = L.bits == 8 ? j : 2 * j;
        auto code = [&](uint64_t v) {
          const float f = E::widen(xb[v]);
          if (!L.rnd.stochastic) return q::quantize(f, s.inv);
          uint32_t draw = q::sr_draw(L.rnd.seed, first + v, jaxhc::bits_of(f));
          return q::quantize_sr(f, s.inv, q::qmax(L.bits), draw);
        };
        lo = code(i);
        if (L.bits == 4 && i + 1 < m) hi = code(i + 1);
      }
      codes[j] = q::code_byte(lo, hi, L.bits);
    }
    if (k + 1 == L.blocks) {
      const uint64_t used = 4 * L.blocks + q::code_bytes(L.r.n, L.bits);
      for (uint64_t b = used + lane; b < L.r.bytes; b += 32) p[b] = 0;
    }
  }
}

// The decoded value i of a row's payload (before rounding to the output type).
__device__ float value_at(const uint8_t* p, const Layout& L, uint64_t i) {
  const float scale = reinterpret_cast<const float*>(p)[i / L.block];
  return q::dequantize(q::code_at(p + 4 * L.blocks, i, L.bits), scale);
}

// payload: rows x parts payloads (parts = 1: decode); each value rounded to T before it is added.
template <typename T>
__global__ void decode_sum_kernel(const uint8_t* payload, uint64_t parts, T* x, Layout L) {
  using E = jaxhc::Elems<T>;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
       t < L.r.rows * L.r.n; t += stride) {
    const uint64_t row = t / L.r.n, i = t % L.r.n;
    float acc = 0.0f;
    for (uint64_t part = 0; part < parts; part++) {
      float v = E::widen(E::narrow(value_at(payload + (row * parts + part) * L.r.bytes, L, i)));
      acc = part ? acc + v : v;
    }
    x[t] = E::narrow(acc);
  }
}

constexpr const char* kTypes = "values must be float32, bfloat16 or float16";

Layout layout(const Rows& r, int64_t bits, int64_t block, q::Rounding rnd = {}) {
  return Layout{r, static_cast<uint64_t>(block), q::blocks_of(r.n, block), static_cast<int>(bits),
                rnd};
}

ffi::Error QuantEncode(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                       ffi::Result<ffi::AnyBuffer> ok, int64_t bits, int64_t block,
                       int64_t stochastic, int64_t seed) {
  const char* op = "jaxhc_quant_encode";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<false>(x.element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    q::Rounding rnd;
    std::string err = q::check_rounding(stochastic, seed, &rnd);
    if (err.empty()) err = q::check_encode_args(x, *payload, *ok, bits, block, &r);
    if (!err.empty()) return void(result = invalid(op, err));
    if (cudaMemsetAsync(ok->untyped_data(), 1, r.rows, stream) != cudaSuccess)
      return void(result = launched(op));
    const Layout L = layout(r, bits, block, rnd);
    uint64_t items = 32 * r.rows * L.blocks;
    if (items)
      encode_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(
          static_cast<const T*>(x.untyped_data()), static_cast<uint8_t*>(payload->untyped_data()),
          static_cast<bool*>(ok->untyped_data()), L);
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error Decode(const char* op, bool sum, cudaStream_t stream, ffi::AnyBuffer payload,
                  ffi::AnyBuffer x, int64_t bits, int64_t block) {
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<false>(x.element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    uint64_t parts = 1;
    std::string err = q::check_decode_args(payload, x, sum, bits, block, &r, &parts);
    if (!err.empty()) return void(result = invalid(op, err));
    uint64_t items = r.rows * r.n;
    if (items)
      decode_sum_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(
          static_cast<const uint8_t*>(payload.untyped_data()), parts,
          static_cast<T*>(x.untyped_data()), layout(r, bits, block));
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error QuantDecode(cudaStream_t stream, ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                       int64_t bits, int64_t block) {
  return Decode("jaxhc_quant_decode", false, stream, payload, *x, bits, block);
}

ffi::Error QuantDecodeSum(cudaStream_t stream, ffi::AnyBuffer payloads,
                          ffi::Result<ffi::AnyBuffer> x, int64_t bits, int64_t block) {
  return Decode("jaxhc_quant_decode_sum", true, stream, payloads, *x, bits, block);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantEncodeCuda, QuantEncode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("block")
                                  .Attr<int64_t>("stochastic")
                                  .Attr<int64_t>("seed"));

namespace {

// decode and decode_sum: payload(s) in, values out.
auto DecodeBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Arg<ffi::AnyBuffer>()
      .Ret<ffi::AnyBuffer>()
      .Attr<int64_t>("bits")
      .Attr<int64_t>("block");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantDecodeCuda, QuantDecode, DecodeBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantDecodeSumCuda, QuantDecodeSum, DecodeBinding());
