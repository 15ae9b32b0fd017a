// The CPU ZFP kernels (cpu/zfp_kernels.h): the block loops of cpu/zfp_blocks.h compiled once per
// instruction set (cpu/zfp_loops.h: function target attributes, every call inlined; the lane loops
// in translation units of their own), one picked per call.
//
// Rows are split over threads in groups of blocks whose bit ranges start on a 64-bit word
// (64 / gcd(maxbits, 64) blocks), so each thread writes whole words of its own and every word of
// a payload, the zero padding of the last one included, is written exactly once.
#include "cpu/zfp_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/zfp.h"
#include "cpu/fp_mode.h"
#include "cpu/memory.h"
#include "cpu/parallel.h"
#include "cpu/zfp_loops.h"

namespace jaxhc {
namespace zfp {
namespace {

// The scalar coders (`loops` gives float32-coded rows to the lane loops under the avx512 and avx2
// kernels). 1-D: with BMI2 bit permutations where the CPU has fast ones.
template <Elem E>
Loops loops_for(Kernel k) {
#if defined(__x86_64__)
  if (k != Kernel::kPortable && kernel_supported(Kernel::kBmi2)) return Bmi2<E>::loops();
#endif
  return Portable<E>::loops();
}

// 2-D/3-D: compiled for AVX2 under the avx512 and avx2 kernels.
template <int D, Elem E>
Loops nd_loops(Kernel k) {
#if defined(__x86_64__)
  if (k == Kernel::kAvx512 || k == Kernel::kAvx2) return NdAvx2<D, E>::loops();
#endif
  (void)k;
  return Nd<D, E>::loops();
}

template <Elem E>
Loops loops_dims(Kernel k, int dims) {
  if (dims == 2) return nd_loops<2, E>(k);
  if (dims == 3) return nd_loops<3, E>(k);
  return loops_for<E>(k);
}

Loops loops(Kernel k, Elem type, int maxbits, int dims) {
#if defined(__x86_64__)
  if (lane_rows(type, maxbits, dims)) {
    if (k == Kernel::kAvx512)
      return dims == 1 ? avx512_lanes_1d(type, maxbits) : avx512_lanes_nd(type, dims);
    if (k == Kernel::kAvx2)
      return dims == 1 ? avx2_lanes_1d(type, maxbits) : avx2_lanes_nd(type, dims);
  }
#endif
  switch (type) {
    case Elem::kF32: return loops_dims<Elem::kF32>(k, dims);
    case Elem::kF64: return loops_dims<Elem::kF64>(k, dims);
    case Elem::kBF16: return loops_dims<Elem::kBF16>(k, dims);
    default: return loops_dims<Elem::kF16>(k, dims);
  }
}

size_t elem_bytes(Elem type) { return type == Elem::kF64 ? 8 : type == Elem::kF32 ? 4 : 2; }

constexpr uint64_t kGrainValues = 65536;  // values per thread at least (start-up ~ tens of us)

uint64_t group_blocks(int maxbits) {
  uint64_t g = 64;
  while (maxbits % 2 == 0 && g > 1) maxbits /= 2, g /= 2;
  return g;
}

// Calls fn(row, first_block, end_block) on word-aligned block ranges covering every row's blocks:
// one thread per core, each taking the next chunk of groups until none is left, so a thread the
// OS runs less (a busy machine) simply takes fewer chunks.
template <typename Fn>
void parallel_blocks(uint64_t rows, uint64_t n, int maxbits, int dims, Fn&& fn) {
  const uint64_t s = static_cast<uint64_t>(block_values(dims));
  const uint64_t group = group_blocks(maxbits), blocks = (n + s - 1) / s;
  const uint64_t groups = (blocks + group - 1) / group, total = rows * groups;
  auto run = [&](uint64_t g0, uint64_t g1) {
    while (g0 < g1) {
      uint64_t row = g0 / groups, ga = g0 % groups, gb = std::min(groups, ga + (g1 - g0));
      fn(row, ga * group, std::min(blocks, gb * group));
      g0 += gb - ga;
    }
  };
  const uint64_t grain = std::max<uint64_t>(1, kGrainValues / s / group);
  const uint64_t threads = std::min<uint64_t>(host_threads(), total / grain);
  if (threads <= 1) return run(0, total);
  const uint64_t chunk = std::max(grain, total / (8 * threads));
  const FpMode mode;
  std::atomic<uint64_t> next{0};
  parallel_for(threads, 1, [&](size_t, size_t) {
    mode.run([&] {
      for (uint64_t g0; (g0 = next.fetch_add(chunk)) < total;) run(g0, std::min(total, g0 + chunk));
    });
  });
}

// Whether the CPU has an instruction-set feature (__builtin_cpu_supports takes literals only).
bool cpu_has(const std::string& f) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (f == "bmi") return __builtin_cpu_supports("bmi");
  if (f == "bmi2") return __builtin_cpu_supports("bmi2");
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "f16c") return __builtin_cpu_supports("f16c");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
  if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (f == "avx512vbmi") return __builtin_cpu_supports("avx512vbmi");
  if (f == "avx512vbmi2") return __builtin_cpu_supports("avx512vbmi2");
  if (f == "gfni") return __builtin_cpu_supports("gfni");
#endif
  (void)f;
  return false;
}

bool cpu_has_all(std::initializer_list<const char*> features) {
  for (const char* f : features)
    if (!cpu_has(f)) return false;
  return true;
}

constexpr Kernel kKernels[] = {Kernel::kAvx512, Kernel::kAvx2, Kernel::kBmi2, Kernel::kPortable};

}  // namespace

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kAvx512: return "avx512";
    case Kernel::kAvx2: return "avx2";
    case Kernel::kBmi2: return "bmi2";
    default: return "portable";
  }
}

bool kernel_supported(Kernel k) {
  static const bool avx512 =
      cpu_has_all({"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi", "avx512vbmi2",
                   "gfni", "avx2", "f16c", "fma", "bmi", "bmi2"});
  static const bool avx2 = cpu_has_all({"avx2", "f16c", "fma", "bmi", "bmi2"});
  // pdep/pext are single fast instructions on Intel since Haswell and AMD since Zen 3; Zen 1/2
  // microcode them (hundreds of cycles), so those take the portable code.
#if defined(__x86_64__)
  static const bool bmi2 =
      cpu_has_all({"bmi", "bmi2"}) && !__builtin_cpu_is("znver1") && !__builtin_cpu_is("znver2");
#else
  static const bool bmi2 = false;
#endif
  switch (k) {
    case Kernel::kAvx512: return avx512;
    case Kernel::kAvx2: return avx2;
    case Kernel::kBmi2: return bmi2;
    default: return true;
  }
}

Kernel active_kernel() {
  const char* env = std::getenv("JAXHC_ZFP_KERNEL");
  std::string name = env ? env : "";
  std::string here;
  for (Kernel k : kKernels) {
    if (!kernel_supported(k)) continue;
    if (name.empty() || name == "auto" || name == kernel_name(k)) return k;
    here += std::string(here.empty() ? "" : ", ") + kernel_name(k);
  }
  for (Kernel k : kKernels)
    if (name == kernel_name(k))
      throw std::invalid_argument("JAXHC_ZFP_KERNEL=" + name +
                                  ": this CPU cannot run it (it runs " + here + ")");
  throw std::invalid_argument("JAXHC_ZFP_KERNEL=" + name +
                              " is not one of auto, avx512, avx2, bmi2, portable");
}

bool encode_blocks(Kernel k, const void* x, Elem type, uint64_t n, int maxbits, int dims,
                   uint64_t b0, uint64_t b1, uint64_t* payload) {
  return loops(k, type, maxbits, dims).encode(x, n, b0, b1, maxbits, payload + b0 * maxbits / 64);
}

void decode_blocks(Kernel k, const uint64_t* payload, Elem type, uint64_t n, int maxbits, int dims,
                   uint64_t b0, uint64_t b1, void* x) {
  loops(k, type, maxbits, dims)
      .decode(payload, payload_bytes(n, maxbits, dims) / 8, n, b0, b1, maxbits, x);
}

void decode_sum_blocks(Kernel k, const uint64_t* const* payloads, int parts, Elem type, uint64_t n,
                       int maxbits, int dims, uint64_t b0, uint64_t b1, void* x) {
  loops(k, type, maxbits, dims)
      .decode_sum(payloads, parts, payload_bytes(n, maxbits, dims) / 8, n, b0, b1, maxbits, x);
}

void encode_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int maxbits,
                 int dims, uint64_t* payload, bool* finite) {
  const Loops f = loops(k, type, maxbits, dims);
  const uint64_t words = payload_bytes(n, maxbits, dims) / 8, row_bytes = n * elem_bytes(type);
  prefer_huge_pages(payload, rows * words * 8);
  for (uint64_t r = 0; r < rows; r++) finite[r] = true;
  parallel_blocks(rows, n, maxbits, dims, [&](uint64_t r, uint64_t b0, uint64_t b1) {
    const void* xr = static_cast<const char*>(x) + r * row_bytes;
    if (!f.encode(xr, n, b0, b1, maxbits, payload + r * words + b0 * maxbits / 64))
      __atomic_store_n(&finite[r], false, __ATOMIC_RELAXED);
  });
}

void decode_rows(Kernel k, const uint64_t* payload, Elem type, uint64_t rows, uint64_t n,
                 int maxbits, int dims, void* x) {
  const Loops f = loops(k, type, maxbits, dims);
  const uint64_t words = payload_bytes(n, maxbits, dims) / 8, row_bytes = n * elem_bytes(type);
  prefer_huge_pages(x, rows * row_bytes);
  parallel_blocks(rows, n, maxbits, dims, [&](uint64_t r, uint64_t b0, uint64_t b1) {
    f.decode(payload + r * words, words, n, b0, b1, maxbits, static_cast<char*>(x) + r * row_bytes);
  });
}

namespace {
// ptrs: parts payload pointers per row.
void decode_sum_ptrs(Kernel k, const uint64_t* const* ptrs, int parts, Elem type, uint64_t rows,
                     uint64_t n, int maxbits, int dims, void* x) {
  const Loops f = loops(k, type, maxbits, dims);
  const uint64_t words = payload_bytes(n, maxbits, dims) / 8, row_bytes = n * elem_bytes(type);
  prefer_huge_pages(x, rows * row_bytes);
  parallel_blocks(rows, n, maxbits, dims, [&](uint64_t r, uint64_t b0, uint64_t b1) {
    f.decode_sum(ptrs + r * parts, parts, words, n, b0, b1, maxbits,
                 static_cast<char*>(x) + r * row_bytes);
  });
}
}  // namespace

void decode_sum_rows(Kernel k, const uint64_t* payload, int parts, Elem type, uint64_t rows,
                     uint64_t n, int maxbits, int dims, void* x) {
  const uint64_t words = payload_bytes(n, maxbits, dims) / 8;
  std::vector<const uint64_t*> ptrs(rows * parts);
  for (uint64_t i = 0; i < ptrs.size(); i++) ptrs[i] = payload + i * words;
  decode_sum_ptrs(k, ptrs.data(), parts, type, rows, n, maxbits, dims, x);
}

bool encode_row(const void* x, Elem type, uint64_t n, int maxbits, int dims, uint64_t* payload) {
  bool finite;
  encode_rows(active_kernel(), x, type, 1, n, maxbits, dims, payload, &finite);
  return finite;
}

void decode_row(const uint64_t* payload, Elem type, uint64_t n, int maxbits, int dims, void* x) {
  decode_rows(active_kernel(), payload, type, 1, n, maxbits, dims, x);
}

void decode_sum(const uint64_t* const* payloads, int parts, Elem type, uint64_t n, int maxbits,
                int dims, void* x) {
  decode_sum_ptrs(active_kernel(), payloads, parts, type, 1, n, maxbits, dims, x);
}

}  // namespace zfp
}  // namespace jaxhc
