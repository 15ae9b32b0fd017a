// CPU handlers of the ZFP fixed-rate codec (contracts in cpu/handlers.h).
//
// Work is split over threads in groups of blocks whose bit ranges start on a 64-bit word
// (64 / gcd(maxbits, 64) blocks), so each thread writes whole words of its own and every word of
// the payload, the zero padding of the last one included, is written exactly once.
#include <cstring>
#include <string>

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

template <typename Fn>
void parallel_groups(const Rows& r, int maxbits, Fn&& fn) {
  uint64_t group = group_blocks(maxbits);
  uint64_t total = r.rows * (((r.n + 3) / 4 + group - 1) / group);
  jaxhc::parallel_for(total, std::max<uint64_t>(1, kGrainBlocks / group), [&](size_t g0, size_t g1) {
    for_groups(r, group, g0, g1, fn);
  });
}

template <typename Scalar>
void encode_rows(const Scalar* x, uint64_t* payload, bool* finite, const Rows& r, int maxbits) {
  for (uint64_t row = 0; row < r.rows; row++) finite[row] = true;
  parallel_groups(r, maxbits, [&](uint64_t row, uint64_t b0, uint64_t b1) {
    const Scalar* xr = x + row * r.n;
    WordWriter out(payload + row * (r.bytes / 8) + b0 * maxbits / 64);
    bool ok = true;
    for (uint64_t b = b0; b < b1; b++) {
      Scalar v[4];
      jaxhc::zfp::load_block(xr, r.n, b, v);
      ok &= jaxhc::zfp::encode_block(v, maxbits, out);
    }
    out.flush();  // only the row's last group ends inside a word
    if (!ok) __atomic_store_n(&finite[row], false, __ATOMIC_RELAXED);
  });
}

template <typename Scalar>
void decode_rows(const uint64_t* payload, Scalar* x, const Rows& r, int maxbits) {
  parallel_groups(r, maxbits, [&](uint64_t row, uint64_t b0, uint64_t b1) {
    const uint64_t* words = payload + row * (r.bytes / 8);
    Scalar* xr = x + row * r.n;
    uint64_t in[Format<Scalar>::kWords];
    for (uint64_t b = b0; b < b1; b++) {
      Scalar v[4];
      jaxhc::zfp::load_block_bits(words, r.bytes / 8, b, maxbits, in);
      jaxhc::zfp::decode_block(in, maxbits, v);
      if (4 * b + 4 <= r.n)
        std::memcpy(xr + 4 * b, v, sizeof v);
      else
        std::memcpy(xr + 4 * b, v, (r.n - 4 * b) * sizeof(Scalar));
    }
  });
}

ffi::Error invalid(const char* op, const std::string& msg) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + msg);
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

template <typename Scalar>
ffi::Error encode_typed(ffi::AnyBuffer x, ffi::AnyBuffer payload, ffi::AnyBuffer finite,
                        int64_t maxbits) {
  Rows r;
  auto fdims = finite.dimensions();
  std::string err = jaxhc::zfp::check_rows<Scalar>(x.dimensions(), payload.dimensions(), &fdims,
                                                   maxbits, &r);
  if (!err.empty()) return invalid("jaxhc_zfp_encode", err);
  if (payload.element_type() != ffi::DataType::U8 || finite.element_type() != ffi::DataType::PRED)
    return invalid("jaxhc_zfp_encode", "results must be (uint8 payload, bool finite)");
  if (!aligned8(payload.untyped_data()))
    return invalid("jaxhc_zfp_encode", "payload buffer is not 8-byte aligned");
  encode_rows(static_cast<const Scalar*>(x.untyped_data()),
              static_cast<uint64_t*>(payload.untyped_data()),
              static_cast<bool*>(finite.untyped_data()), r, static_cast<int>(maxbits));
  return ffi::Error::Success();
}

template <typename Scalar>
ffi::Error decode_typed(ffi::AnyBuffer payload, ffi::AnyBuffer x, int64_t maxbits) {
  Rows r;
  std::string err = jaxhc::zfp::check_rows<Scalar>(
      x.dimensions(), payload.dimensions(), static_cast<ffi::AnyBuffer::Dimensions*>(nullptr),
      maxbits, &r);
  if (!err.empty()) return invalid("jaxhc_zfp_decode", err);
  if (payload.element_type() != ffi::DataType::U8)
    return invalid("jaxhc_zfp_decode", "payload must be uint8");
  if (!aligned8(payload.untyped_data()))
    return invalid("jaxhc_zfp_decode", "payload buffer is not 8-byte aligned");
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
