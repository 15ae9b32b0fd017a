// CUDA handlers of the block-quantization codecs q8/q4 and, rotated, q8:h/q4:h: the arithmetic of
// ffi/core/quant.h and quant_rotated.h on the device, run on XLA's stream with no allocation and
// no synchronization (contracts in cpu/handlers.h).
//
// Encode runs one warp per block: the lanes take the largest |x| bits of the block (a warp max),
// lane 0 stores the scale, and the lanes write the code bytes (one or two values each); the warp
// of a row's last block zeroes the padding (stochastic rounding: the draws of core/quant.h). Decode and decode-and-sum run one thread per value;
// decode-and-sum adds the P decoded values (each rounded to the output type first) in rank
// order. Products use __fmul_rn, which is never contracted into an FMA.
//
// Rotated blocks run one warp per block, lane j holding values r * 32 + j (a team of
// core/quant_rotated.h: the lane stages of the transform are shuffles, the row stages adds in
// registers); the warp's thresholds sit in shared memory for the codes' binary search, and
// decoding reads the levels from a shared copy.
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/ffi_args.h"
#include "core/quant.h"
#include "core/quant_rotated.h"
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

// --- rotated blocks ----------------------------------------------------------------------------

// The 32 lanes of a warp (core's ScalarTeam for the row arithmetic).
struct WarpTeam : q::ScalarTeam {
  static constexpr int kLanes = 32, kGroup = 32;
  static JAXHC_HD V lane_butterfly(V v, int h) {
#if defined(__CUDA_ARCH__)
    const V p = __shfl_xor_sync(0xffffffffu, v, h);
    return (threadIdx.x & h) ? p - v : v + p;
#else
    return v + h;  // host pass only: never run
#endif
  }
  static JAXHC_HD double lane_total(D d) {
#if defined(__CUDA_ARCH__)
    for (int o = 16; o; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);  // exact sums
#endif
    return d;
  }
  static JAXHC_HD int64_t itotal(I i) {
#if defined(__CUDA_ARCH__)
    for (int o = 16; o; o /= 2) i += __shfl_xor_sync(0xffffffffu, i, o);
#endif
    return i;
  }
};

// The first warp of this thread and the warps of the grid.
__device__ uint64_t first_warp() {
  return (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
}
__device__ uint64_t grid_warps() { return static_cast<uint64_t>(gridDim.x) * blockDim.x / 32; }

template <typename T, int B, int bits>
__global__ void rot_encode_kernel(const T* x, uint8_t* payload, bool* ok, Layout L) {
  using E = jaxhc::Elems<T>;
  constexpr int R = B / 32, half = 1 << (bits - 1), nbytes = B * bits / 8;
  __shared__ int32_t thr_all[jaxhc::cuda::kThreads / 32][half];
  const int lane = threadIdx.x % 32;
  int32_t* thr = thr_all[threadIdx.x / 32];
  const float* t = bits == 8 ? q::kThresholds8 : q::kThresholds4;
  for (uint64_t w = first_warp(); w < L.r.rows * L.blocks; w += grid_warps()) {
    const uint64_t row = w / L.blocks, k = w % L.blocks, first = k * B;
    const uint64_t m = L.r.n - first < B ? L.r.n - first : B;
    const T* xb = x + row * L.r.n + first;
    float f[R];
    uint32_t a = 0;
    for (int r = 0; r < R; r++) {
      const uint32_t i = r * 32 + lane;
      f[r] = i < m ? E::widen(xb[i]) : 0.0f;
      a = max(a, q::abs_bits(f[r]));
    }
    for (int off = 16; off; off /= 2) a = max(a, __shfl_xor_sync(0xffffffffu, a, off));
    uint8_t* p = payload + row * L.r.bytes;
    uint8_t* codes = p + 4 * L.blocks + first * bits / 8;
    if (a >= q::kHugeBits || a < q::kTinyRotBits) {  // not ok, or (nearly) all zeros
      if (lane == 0) {
        reinterpret_cast<float*>(p)[k] = 0.0f;
        if (a >= q::kHugeBits) ok[row] = false;  // initialized to true
      }
      for (int j = lane; j < nbytes; j += 32) codes[j] = 0;
    } else {
      const float factor = q::fixed_factor(a);
      int32_t v[R];
      for (int r = 0; r < R; r++) v[r] = q::to_fixed(f[r], factor, q::negated(r * 32 + lane));
      const double sigma = q::sqrt_rn(q::sum_squares<WarpTeam, R>(v));
      q::fwht<WarpTeam, R>(v);
      double gain = sigma;
      if (bits == 4) {  // every lane the same choice (the sums are the warp's)
        int32_t chosen[8];
        gain = q::choose_scale<WarpTeam, R>(v, sigma, q::kThresholds4, q::kLevels4, chosen);
        if (lane < 8) thr[lane] = chosen[lane];
      } else {
        for (int j = lane; j < half; j += 32) thr[j] = q::fixed_threshold(t, j, bits, sigma);
      }
      if (lane == 0) reinterpret_cast<float*>(p)[k] = q::block_scale(gain, q::log2_of(B), a);
      __syncwarp();
      for (int r = 0; r < R; r++) {
        const int c = q::code_of(v[r], thr, bits);
        if (bits == 8) {
          codes[r * 32 + lane] = static_cast<uint8_t>(c);
        } else {
          const int hi = __shfl_down_sync(0xffffffffu, c, 1);
          if (!(lane & 1)) codes[(r * 32 + lane) / 2] = static_cast<uint8_t>(c | hi << 4);
        }
      }
      __syncwarp();  // thr is the next block's
    }
    if (k + 1 == L.blocks) {
      const uint64_t used = 4 * L.blocks + L.blocks * nbytes;
      for (uint64_t b = used + lane; b < L.r.bytes; b += 32) p[b] = 0;
    }
  }
}

// payload: rows x parts payloads (parts = 1: decode); each value rounded to T before it is added.
template <typename T, int B, int bits>
__global__ void rot_decode_sum_kernel(const uint8_t* payload, uint64_t parts, T* x, Layout L) {
  using E = jaxhc::Elems<T>;
  constexpr int R = B / 32, half = 1 << (bits - 1);
  __shared__ int32_t levels[half];
  const int32_t* table = bits == 8 ? q::kLevels8 : q::kLevels4;
  for (int j = threadIdx.x; j < half; j += blockDim.x) levels[j] = table[j];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  for (uint64_t w = first_warp(); w < L.r.rows * L.blocks; w += grid_warps()) {
    const uint64_t row = w / L.blocks, k = w % L.blocks, first = k * B;
    const uint64_t m = L.r.n - first < B ? L.r.n - first : B;
    float acc[R];
    for (uint64_t part = 0; part < parts; part++) {
      const uint8_t* p = payload + (row * parts + part) * L.r.bytes;
      const float s = reinterpret_cast<const float*>(p)[k];
      const uint8_t* codes = p + 4 * L.blocks + first * bits / 8;
      float out[R];
      if (!q::valid_scale(s)) {  // the same for the whole warp
        for (int r = 0; r < R; r++) out[r] = 0.0f;
      } else {
        int32_t v[R];
        for (int r = 0; r < R; r++) {
          const uint32_t i = r * 32 + lane;
          const int c = bits == 8 ? codes[i] : (codes[i / 2] >> 4 * (i & 1)) & 0xf;
          v[r] = q::level_of(c, levels, bits);
        }
        q::fwht<WarpTeam, R>(v);
        for (int r = 0; r < R; r++)
          out[r] = E::widen(E::narrow(q::decoded(v[r], s, q::negated(r * 32 + lane))));
      }
      for (int r = 0; r < R; r++) acc[r] = part ? __fadd_rn(acc[r], out[r]) : out[r];
    }
    T* xb = x + row * L.r.n + first;
    for (int r = 0; r < R; r++)
      if (r * 32 + lane < m) xb[r * 32 + lane] = E::narrow(acc[r]);
  }
}

template <typename Fn>
void with_bits(int64_t bits, Fn&& fn) {
  if (bits == 8) return fn(q::IntTag<8>{});
  fn(q::IntTag<4>{});
}

constexpr const char* kTypes = "values must be float32, bfloat16 or float16";

Layout layout(const Rows& r, int64_t bits, int64_t block, q::Rounding rnd = {}) {
  return Layout{r, static_cast<uint64_t>(block), q::blocks_of(r.n, block), static_cast<int>(bits),
                rnd};
}

ffi::Error QuantEncode(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                       ffi::Result<ffi::AnyBuffer> ok, int64_t bits, int64_t block,
                       int64_t rotate, int64_t stochastic, int64_t seed) {
  const char* op = "jaxhc_quant_encode";
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<false>(x.element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    q::Rounding rnd;
    std::string err = q::check_rounding(stochastic, seed, &rnd);
    if (err.empty() && rotate == 1 && rnd.stochastic)
      err = "stochastic rounding is not available for rotated blocks";
    if (err.empty()) err = q::check_encode_args(x, *payload, *ok, bits, block, rotate, &r);
    if (!err.empty()) return void(result = invalid(op, err));
    if (cudaMemsetAsync(ok->untyped_data(), 1, r.rows, stream) != cudaSuccess)
      return void(result = launched(op));
    const Layout L = layout(r, bits, block, rnd);
    uint64_t items = 32 * r.rows * L.blocks;
    const T* xs = static_cast<const T*>(x.untyped_data());
    auto* ps = static_cast<uint8_t*>(payload->untyped_data());
    auto* oks = static_cast<bool*>(ok->untyped_data());
    if (items && rotate) {
      q::with_block(block, [&](auto b) {
        with_bits(bits, [&](auto n) {
          rot_encode_kernel<T, decltype(b)::value, decltype(n)::value>
              <<<grid_for(items), kThreads, 0, stream>>>(xs, ps, oks, L);
        });
      });
    } else if (items) {
      encode_kernel<T><<<grid_for(items), kThreads, 0, stream>>>(xs, ps, oks, L);
    }
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error Decode(const char* op, bool sum, cudaStream_t stream, ffi::AnyBuffer payload,
                  ffi::AnyBuffer x, int64_t bits, int64_t block, int64_t rotate) {
  ffi::Error result = ffi::Error::Success();
  bool known = jaxhc::cuda::with_elem<false>(x.element_type(), [&](auto t) {
    using T = decltype(t);
    Rows r;
    uint64_t parts = 1;
    std::string err = q::check_decode_args(payload, x, sum, bits, block, rotate, &r, &parts);
    if (!err.empty()) return void(result = invalid(op, err));
    const auto* ps = static_cast<const uint8_t*>(payload.untyped_data());
    T* xs = static_cast<T*>(x.untyped_data());
    const Layout L = layout(r, bits, block);
    if (rotate && r.rows * L.blocks) {
      q::with_block(block, [&](auto b) {
        with_bits(bits, [&](auto n) {
          rot_decode_sum_kernel<T, decltype(b)::value, decltype(n)::value>
              <<<grid_for(32 * r.rows * L.blocks), kThreads, 0, stream>>>(ps, parts, xs, L);
        });
      });
    } else if (!rotate && r.rows * r.n) {
      decode_sum_kernel<T><<<grid_for(r.rows * r.n), kThreads, 0, stream>>>(ps, parts, xs, L);
    }
    result = launched(op);
  });
  return known ? std::move(result) : invalid(op, kTypes);
}

ffi::Error QuantDecode(cudaStream_t stream, ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                       int64_t bits, int64_t block, int64_t rotate) {
  return Decode("jaxhc_quant_decode", false, stream, payload, *x, bits, block, rotate);
}

ffi::Error QuantDecodeSum(cudaStream_t stream, ffi::AnyBuffer payloads,
                          ffi::Result<ffi::AnyBuffer> x, int64_t bits, int64_t block,
                          int64_t rotate) {
  return Decode("jaxhc_quant_decode_sum", true, stream, payloads, *x, bits, block, rotate);
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
                                  .Attr<int64_t>("rotate")
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
      .Attr<int64_t>("block")
      .Attr<int64_t>("rotate");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantDecodeCuda, QuantDecode, DecodeBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcQuantDecodeSumCuda, QuantDecodeSum, DecodeBinding());
