// CPU handlers of the ZFP fixed-rate codec (contracts in cpu/handlers.h).
//
// Work is split over threads in groups of blocks whose bit ranges start on a 64-bit word
// (64 / gcd(maxbits, 64) blocks), so each thread writes whole words of its own and every word of
// the payload, the zero padding of the last one included, is written exactly once. The block
// loops exist twice: portable, and with BMI2 bit permutations picked at run time (x86-64).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/ffi_args.h"
#include "core/zfp.h"
#include "cpu/handlers.h"
#include "cpu/parallel.h"

namespace ffi = xla::ffi;

namespace {

using jaxhc::zfp::Format;
using jaxhc::zfp::Rows;

constexpr size_t kGrainBlocks = 16384;  // blocks per thread at least (thread start-up ~ tens of us)

// Appends bit fields to 64-bit little-endian words, LSB first.
class WordWriter {
 public:
  explicit WordWriter(uint64_t* out) : out_(out) {}

  // Appends the n low bits of v (0 <= n <= 64, no bits above them).
  void put(uint64_t v, int n) {
    acc_ |= v << fill_;
    if (fill_ + n >= 64) {
      *out_++ = acc_;
      acc_ = fill_ ? v >> (64 - fill_) : 0;
      fill_ += n - 64;
    } else {
      fill_ += n;
    }
  }

  void flush() {
    if (fill_) *out_ = acc_;
  }

 private:
  uint64_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

uint64_t group_blocks(int maxbits) {
  uint64_t g = 64;
  while (maxbits % 2 == 0 && g > 1) maxbits /= 2, g /= 2;
  return g;
}

// Calls fn(row, first_block, end_block) for the word-aligned block groups [g0, g1) of the
// flattened (row, group) index space.
template <typename Fn>
void for_groups(const Rows& r, uint64_t group, uint64_t g0, uint64_t g1, Fn&& fn) {
  uint64_t blocks = (r.n + 3) / 4, groups = (blocks + group - 1) / group;
  while (g0 < g1) {
    uint64_t row = g0 / groups, ga = g0 % groups, gb = std::min(groups, ga + (g1 - g0));
    fn(row, ga * group, std::min(blocks, gb * group));
    g0 += gb - ga;
  }
}

// Runs fn over all block groups: one thread per core, each taking the next chunk of groups
// until none is left, so a thread the OS runs less (a busy machine) simply takes fewer chunks.
template <typename Fn>
void parallel_groups(const Rows& r, int maxbits, Fn&& fn) {
  uint64_t group = group_blocks(maxbits);
  uint64_t total = r.rows * (((r.n + 3) / 4 + group - 1) / group);
  uint64_t grain = std::max<uint64_t>(1, kGrainBlocks / group);
  uint64_t threads = std::min<uint64_t>(jaxhc::host_threads(), total / grain);
  if (threads <= 1) {
    for_groups(r, group, 0, total, fn);
    return;
  }
  uint64_t chunk = std::max(grain, total / (8 * threads));
  std::atomic<uint64_t> next{0};
  jaxhc::parallel_for(threads, 1, [&](size_t, size_t) {
    for (uint64_t g0; (g0 = next.fetch_add(chunk)) < total;)
      for_groups(r, group, g0, std::min(total, g0 + chunk), fn);
  });
}

// The blocks [b0, b1) of one row, coded into the stream from word `words` on (b0 starts a word).
template <typename Scalar, typename Bits>
inline bool encode_blocks(const Scalar* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits,
                          uint64_t* words) {
  WordWriter out(words);
  bool ok = true;
  uint64_t full = std::min(b1, n / 4);
  for (uint64_t b = b0; b < full; b++)
    ok &= jaxhc::zfp::encode_block<Bits>(x + 4 * b, maxbits, out);
  if (full < b1) {  // the row's partial last block
    Scalar v[4];
    jaxhc::zfp::load_block(x, n, full, v);
    ok &= jaxhc::zfp::encode_block<Bits>(v, maxbits, out);
  }
  out.flush();  // only the row's last group ends inside a word
  return ok;
}

template <typename Scalar, typename Bits>
inline void decode_blocks(const uint64_t* words, uint64_t nwords, uint64_t n, uint64_t b0,
                          uint64_t b1, int maxbits, Scalar* x) {
  uint64_t in[Format<Scalar>::kWords];
  for (uint64_t b = b0; b < b1; b++) {
    jaxhc::zfp::load_block_bits(words, nwords, b, maxbits, in);
    if (4 * b + 4 <= n) {
      jaxhc::zfp::decode_block<Bits>(in, maxbits, x + 4 * b);
    } else {  // the row's partial last block
      Scalar v[4];
      jaxhc::zfp::decode_block<Bits>(in, maxbits, v);
      std::memcpy(x + 4 * b, v, (n - 4 * b) * sizeof(Scalar));
    }
  }
}

template <typename Scalar>
struct Kernels {
  bool (*encode)(const Scalar*, uint64_t, uint64_t, uint64_t, int, uint64_t*);
  void (*decode)(const uint64_t*, uint64_t, uint64_t, uint64_t, uint64_t, int, Scalar*);
};

#if defined(__x86_64__)
// The plane coder's bit permutations as single BMI2 instructions (the same bits as PortableBits).
struct Bmi2Bits {
  template <typename UInt>
  __attribute__((target("bmi,bmi2"))) static uint64_t window(const UInt* u, int k) {
    constexpr int prec = 8 * sizeof(UInt);
    uint64_t m = 0;
    for (int i = 0; i < 4; i++)
      m |= _pdep_u64(static_cast<UInt>(u[i] << (prec - 1 - k)) >> (prec - 16),
                     0x1111111111111111ull << i);
    return jaxhc::zfp::detail::reverse_nibbles(m);
  }
  template <typename UInt>
  __attribute__((target("bmi,bmi2"))) static void deposit(UInt* u, int k, uint64_t w) {
    constexpr int prec = 8 * sizeof(UInt);
    uint64_t m = jaxhc::zfp::detail::reverse_nibbles(w);
    for (int i = 0; i < 4; i++)
      u[i] |= static_cast<UInt>(static_cast<UInt>(_pext_u64(m, 0x1111111111111111ull << i))
                                << (prec - 16)) >> (prec - 1 - k);
  }
  __attribute__((target("bmi,bmi2"))) static uint64_t compact(uint64_t w, int f) {
    return _pext_u64(w, ((uint64_t{1} << f) - 1) * 0x1111111111111111ull);
  }
  __attribute__((target("bmi,bmi2"))) static uint64_t expand(uint64_t w, int f) {
    return _pdep_u64(w, ((uint64_t{1} << f) - 1) * 0x1111111111111111ull);
  }
};

// Compiled for BMI2 with every call inlined (flatten), so the pdep/pext above inline too.
template <typename Scalar>
__attribute__((target("bmi,bmi2"), flatten)) bool encode_blocks_bmi2(
    const Scalar* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits, uint64_t* words) {
  return encode_blocks<Scalar, Bmi2Bits>(x, n, b0, b1, maxbits, words);
}

template <typename Scalar>
__attribute__((target("bmi,bmi2"), flatten)) void decode_blocks_bmi2(
    const uint64_t* words, uint64_t nwords, uint64_t n, uint64_t b0, uint64_t b1, int maxbits,
    Scalar* x) {
  decode_blocks<Scalar, Bmi2Bits>(words, nwords, n, b0, b1, maxbits, x);
}

// pdep/pext are single fast instructions on Intel since Haswell and AMD since Zen 3; Zen 1/2
// microcode them (hundreds of cycles), so those take the portable code.
bool fast_bmi2() {
  static const bool fast = __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                           !__builtin_cpu_is("znver1") && !__builtin_cpu_is("znver2");
  return fast;
}
#endif

// JAXHC_ZFP_PORTABLE=1 forces the portable code (the tests check both give zfpy's stream).
template <typename Scalar>
Kernels<Scalar> kernels() {
#if defined(__x86_64__)
  const char* portable = std::getenv("JAXHC_ZFP_PORTABLE");
  if (fast_bmi2() && !(portable && *portable && *portable != '0'))
    return {encode_blocks_bmi2<Scalar>, decode_blocks_bmi2<Scalar>};
#endif
  return {encode_blocks<Scalar, jaxhc::zfp::PortableBits>,
          decode_blocks<Scalar, jaxhc::zfp::PortableBits>};
}

template <typename Scalar>
void encode_rows(const Scalar* x, uint64_t* payload, bool* finite, const Rows& r, int maxbits) {
  for (uint64_t row = 0; row < r.rows; row++) finite[row] = true;
  Kernels<Scalar> k = kernels<Scalar>();
  parallel_groups(r, maxbits, [&](uint64_t row, uint64_t b0, uint64_t b1) {
    uint64_t* words = payload + row * (r.bytes / 8) + b0 * maxbits / 64;
    if (!k.encode(x + row * r.n, r.n, b0, b1, maxbits, words))
      __atomic_store_n(&finite[row], false, __ATOMIC_RELAXED);
  });
}

template <typename Scalar>
void decode_rows(const uint64_t* payload, Scalar* x, const Rows& r, int maxbits) {
  Kernels<Scalar> k = kernels<Scalar>();
  parallel_groups(r, maxbits, [&](uint64_t row, uint64_t b0, uint64_t b1) {
    k.decode(payload + row * (r.bytes / 8), r.bytes / 8, r.n, b0, b1, maxbits, x + row * r.n);
  });
}

ffi::Error invalid(const char* op, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + msg);
}

template <typename Scalar>
ffi::Error encode_typed(ffi::AnyBuffer x, ffi::AnyBuffer payload, ffi::AnyBuffer finite,
                        int64_t maxbits) {
  Rows r;
  std::string err = jaxhc::zfp::check_encode_args<Scalar>(x, payload, finite, maxbits, &r);
  if (!err.empty()) return invalid("jaxhc_zfp_encode", err);
  encode_rows(static_cast<const Scalar*>(x.untyped_data()),
              static_cast<uint64_t*>(payload.untyped_data()),
              static_cast<bool*>(finite.untyped_data()), r, static_cast<int>(maxbits));
  return ffi::Error::Success();
}

template <typename Scalar>
ffi::Error decode_typed(ffi::AnyBuffer payload, ffi::AnyBuffer x, int64_t maxbits) {
  Rows r;
  std::string err = jaxhc::zfp::check_decode_args<Scalar>(payload, x, maxbits, &r);
  if (!err.empty()) return invalid("jaxhc_zfp_decode", err);
  decode_rows(static_cast<const uint64_t*>(payload.untyped_data()),
              static_cast<Scalar*>(x.untyped_data()), r, static_cast<int>(maxbits));
  return ffi::Error::Success();
}

ffi::Error ZfpEncode(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                     ffi::Result<ffi::AnyBuffer> finite, int64_t maxbits) {
  switch (x.element_type()) {
    case ffi::DataType::F32:
      return encode_typed<float>(x, *payload, *finite, maxbits);
    case ffi::DataType::F64:
      return encode_typed<double>(x, *payload, *finite, maxbits);
    default:
      return invalid("jaxhc_zfp_encode", "values must be float32 or float64");
  }
}

ffi::Error ZfpDecode(ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x, int64_t maxbits) {
  switch (x->element_type()) {
    case ffi::DataType::F32:
      return decode_typed<float>(payload, *x, maxbits);
    case ffi::DataType::F64:
      return decode_typed<double>(payload, *x, maxbits);
    default:
      return invalid("jaxhc_zfp_decode", "values must be float32 or float64");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpEncodeCpu, ZfpEncode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcZfpDecodeCpu, ZfpDecode,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("maxbits"));

namespace jaxhc {
namespace zfp {

// Host entry points for the Python module (same kernels and threads as the handlers).
bool encode_host(const void* x, bool f64, uint64_t n, int maxbits, uint64_t* payload) {
  Rows r{1, n, payload_bytes(n, static_cast<uint32_t>(maxbits))};
  bool finite = true;
  if (f64)
    encode_rows(static_cast<const double*>(x), payload, &finite, r, maxbits);
  else
    encode_rows(static_cast<const float*>(x), payload, &finite, r, maxbits);
  return finite;
}

void decode_host(const uint64_t* payload, bool f64, uint64_t n, int maxbits, void* x) {
  Rows r{1, n, payload_bytes(n, static_cast<uint32_t>(maxbits))};
  if (f64)
    decode_rows(payload, static_cast<double*>(x), r, maxbits);
  else
    decode_rows(payload, static_cast<float*>(x), r, maxbits);
}

}  // namespace zfp
}  // namespace jaxhc
