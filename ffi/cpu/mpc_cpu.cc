// CPU XLA FFI handlers of the MPC codec (contract in cpu/handlers.h). Small rows of a batch run on
// separate threads; a large row is cut into runs of chunks that the threads code in turn, each
// written to its final place in the payload (see EncodeRow).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/ffi_args.h"
#include "core/mpc.h"
#include "core/mpc_chunk.h"
#include "cpu/handlers.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include "cpu/mpc_avx2.h"
#endif
#include "cpu/parallel.h"

namespace ffi = xla::ffi;

namespace jaxhc {
namespace mpc {
namespace {

constexpr size_t kPartChunks = 64;  // a row is split across threads in runs this long

ffi::Error Invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("mpc " + what);
}

// XLA:CPU hands the handlers fresh, untouched output buffers on every call, and first-touch faults
// of 4 KiB pages cost ~45 ms per 64 MiB on this (virtualized) host against ~10 ms with 2 MiB pages
// -- more than the codec itself. So we ask for huge pages on the buffers we are about to fill: a
// hint on the 2 MiB-aligned interior of our own output, ignored where unsupported.
void PreferHugePages(void* data, size_t bytes) {
#if defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 4 * kHuge) return;
  uintptr_t b = (uintptr_t(data) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t e = (uintptr_t(data) + bytes) & ~(kHuge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#endif
}

// A thread's working memory for one chunk at a time.
template <typename U>
struct ChunkWork {
  alignas(64) ChunkRows<U, Tiles<U>::T> rows;
  alignas(64) U stage[kChunkWords + 8];
  alignas(64) U words[kChunkWords];
};

// Encodes the chunk x[0, m) and writes the first min(stream size, room) bytes of its stream to
// out. Returns the stream size (<= m * sizeof(U)).
template <typename U, typename Team>
JAXHC_HD uint32_t EncodeWith(const Team& team, const U* x, uint32_t m, uint32_t dim,
                             uint8_t* out, uint64_t room, ChunkWork<U>& w) {
  uint8_t* stage = reinterpret_cast<uint8_t*>(w.stage);
  const uint32_t size = encode_chunk<U>(team, Words<U>{x}, m, dim, w.rows, stage);
  const void* stream = size == m * sizeof(U) ? static_cast<const void*>(x) : stage;
  memcpy(out, stream, std::min<uint64_t>(size, room));
  return size;
}

// Decodes chunk stream s (size bytes, located) into x[0, m).
template <typename U, typename Team>
JAXHC_HD Status DecodeWith(const Team& team, const uint8_t* s, uint32_t size, uint32_t m,
                           uint32_t dim, U* x, ChunkWork<U>& w) {
  if (size == m * sizeof(U)) {
    memcpy(x, s, size);
    return kOk;
  }
  return decode_chunk<U>(team, s, size, m, dim, w.rows, w.stage, x);
}

// The chunk codec twice: portable (the module's baseline), and on x86-64 compiled for x86-64-v3
// with the AVX2 data movements for 32- and 16-bit words (cpu/mpc_avx2.h), chosen per call.
template <typename U>
struct ChunkCodec {
  static uint32_t Encode(const U* x, uint32_t m, uint32_t dim, uint8_t* out, uint64_t room,
                         ChunkWork<U>& w) {
    return EncodeWith<U>(SerialTeam<U>{}, x, m, dim, out, room, w);
  }
  static Status Decode(const uint8_t* s, uint32_t size, uint32_t m, uint32_t dim, U* x,
                       ChunkWork<U>& w) {
    return DecodeWith<U>(SerialTeam<U>{}, s, size, m, dim, x, w);
  }
};

#if defined(__x86_64__) && defined(__GNUC__)
#define JAXHC_V3 __attribute__((target("arch=x86-64-v3")))

template <typename U>
auto FastTeam(ChunkWork<U>& w) {
  if constexpr (sizeof(U) == 4) return Avx2Team32{{}, shuffles(), w.words};
  else if constexpr (sizeof(U) == 2) return Avx2Team16{{}, shuffles16(), w.words};
  else return SerialTeam<U>{};
}

template <typename U>
struct FastChunkCodec {
  JAXHC_V3 static uint32_t Encode(const U* x, uint32_t m, uint32_t dim, uint8_t* out,
                                  uint64_t room, ChunkWork<U>& w) {
    return EncodeWith<U>(FastTeam<U>(w), x, m, dim, out, room, w);
  }
  JAXHC_V3 static Status Decode(const uint8_t* s, uint32_t size, uint32_t m, uint32_t dim, U* x,
                                ChunkWork<U>& w) {
    return DecodeWith<U>(FastTeam<U>(w), s, size, m, dim, x, w);
  }
};
#endif

// JAXHC_MPC_PORTABLE=1 forces the portable codec (the tests check both write the same payloads).
bool UseFastCodec() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                          __builtin_cpu_supports("popcnt");
  const char* portable = std::getenv("JAXHC_MPC_PORTABLE");
  return cpu && !(portable && *portable && *portable != '0');
#else
  return false;
#endif
}

template <typename U>
uint32_t EncodeChunk(bool fast, const U* x, uint32_t m, uint32_t dim, uint8_t* out, uint64_t room,
                     ChunkWork<U>& w) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (fast) return FastChunkCodec<U>::Encode(x, m, dim, out, room, w);
#endif
  return ChunkCodec<U>::Encode(x, m, dim, out, room, w);
}

template <typename U>
Status DecodeChunk(bool fast, const uint8_t* s, uint32_t size, uint32_t m, uint32_t dim, U* x,
                   ChunkWork<U>& w) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (fast) return FastChunkCodec<U>::Decode(s, size, m, dim, x, w);
#endif
  return ChunkCodec<U>::Decode(s, size, m, dim, x, w);
}

// Contiguous runs of chunks [begin(p), begin(p + 1)) for `parts` threads (the decoder's split).
struct Runs {
  uint64_t nchunks;
  size_t parts;
  uint64_t begin(size_t p) const { return nchunks * p / parts; }
};

size_t PartsFor(uint64_t nchunks, size_t rows) {
  if (rows > 1 && nchunks < 2 * kPartChunks) return 1;
  return std::max<size_t>(1, std::min<size_t>(host_threads(), nchunks / kPartChunks));
}

// Calls fn(row, parts) for every row: rows spread over threads when each is small.
template <typename Fn>
void ForRows(size_t rows, uint64_t nchunks, Fn&& fn) {
  size_t parts = PartsFor(nchunks, rows);
  if (parts > 1) {
    for (size_t r = 0; r < rows; ++r) fn(r, parts);
  } else {
    size_t grain = std::max<uint64_t>(1, kPartChunks / nchunks);
    parallel_for(rows, grain, [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) fn(r, size_t{1});
    });
  }
}

// Zeroes [p, p + bytes) with every thread, in pieces of 1 MiB.
void ZeroParallel(uint8_t* p, uint64_t bytes) {
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  parallel_for((bytes + kPiece - 1) / kPiece, 1, [&](size_t b, size_t e) {
    const uint64_t lo = b * kPiece, hi = std::min(bytes, e * kPiece);
    memset(p + lo, 0, hi - lo);
  });
}

// The stream offsets of a row coded by several threads (EncodeRow): the end of run k's streams
// is published once run k - 1's is known and run k is coded, which gives run k + 1 its start.
class RunEnds {
 public:
  static constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();
  explicit RunEnds(uint64_t runs) : ends_(runs) {
    for (auto& e : ends_) e.store(kUnknown, std::memory_order_relaxed);
  }
  // Run k's start, or kUnknown while run k - 1 is not done.
  uint64_t start(uint64_t k) const {
    return k ? ends_[k - 1].load(std::memory_order_acquire) : 0;
  }
  // Run k's start, once known. Run k - 1 was claimed before run k by a thread that is running it
  // (it waits only on runs claimed before it), so this returns.
  uint64_t wait_start(uint64_t k) const {
    uint64_t s;
    for (unsigned spins = 0; (s = start(k)) == kUnknown; ++spins)
      if (spins >= 64) std::this_thread::yield();
    return s;
  }
  void publish(uint64_t k, uint64_t end) { ends_[k].store(end, std::memory_order_release); }
  uint64_t last() const { return ends_.back().load(std::memory_order_acquire); }

 private:
  std::vector<std::atomic<uint64_t>> ends_;
};

// Encodes one row into its payload. The threads claim runs of kPartChunks chunks in row order; a
// run whose start is known when it is claimed (always so with one thread) is coded straight to
// its place in the payload, any other into the thread's staging buffer (a run's worst case, 256
// KiB of float32, so it stays in the L2 cache) and copied to its place once the run before it
// has published its end. Every byte of the payload is written once, in the same layout whatever
// the thread count, and no pass over the row follows the coding but the zeroing of the unused
// tail. Streams past the capacity are cut (over budget: the table is still complete).
template <typename U>
int32_t EncodeRow(const U* x, uint64_t n, uint32_t dim, uint8_t* payload, uint64_t capacity,
                  size_t parts, bool fast) {
  constexpr uint32_t wb = sizeof(U);
  const uint64_t nchunks = chunk_count(n), nruns = (nchunks + kPartChunks - 1) / kPartChunks;
  const uint64_t head = header_bytes(n, wb), room = capacity - head;
  uint8_t* const table = payload + kFixedHeader;
  uint8_t* const streams = payload + head;
  RunEnds ends(nruns);
  std::atomic<uint64_t> next{0};
  // Codes chunks [c0, c1) to out (room bytes there, cut beyond), their end offsets counted from
  // `base` into the table; returns the bytes they need.
  auto code = [&](uint64_t c0, uint64_t c1, uint64_t base, uint8_t* out, uint64_t out_room,
                  ChunkWork<U>& work) {
    uint64_t pos = 0;
    for (uint64_t c = c0; c < c1; ++c) {
      const uint64_t left = pos < out_room ? out_room - pos : 0;
      pos += EncodeChunk<U>(fast, x + c * kChunkWords, chunk_words(n, c), dim,
                            left ? out + pos : out, left, work);
      store<uint32_t>(table + 4 * c, uint32_t(base + pos));  // fits: max_payload_bytes < 2^31
    }
    return pos;
  };
  parallel_for(std::min<uint64_t>(parts, nruns), 1, [&](size_t, size_t) {
    ChunkWork<U> work;
    std::vector<uint8_t> stage;
    for (uint64_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < nruns;) {
      const uint64_t c0 = k * kPartChunks, c1 = std::min(nchunks, c0 + kPartChunks);
      uint64_t start = ends.start(k);
      if (start != RunEnds::kUnknown) {
        const uint64_t out_room = start < room ? room - start : 0;
        ends.publish(k, start + code(c0, c1, start, streams + std::min(start, room), out_room,
                                     work));
        continue;
      }
      stage.resize(kPartChunks * kChunkWords * wb);
      const uint64_t size = code(c0, c1, 0, stage.data(), stage.size(), work);
      start = ends.wait_start(k);
      ends.publish(k, start + size);
      for (uint64_t c = c0; c < c1; ++c)  // the ends counted from the run's start
        store<uint32_t>(table + 4 * c, uint32_t(start + load<uint32_t>(table + 4 * c)));
      if (start < room) memcpy(streams + start, stage.data(), std::min(size, room - start));
    }
  });
  memset(payload + kFixedHeader + 4 * nchunks, 0, head - kFixedHeader - 4 * nchunks);
  const uint64_t used = head + ends.last();
  if (used < capacity) ZeroParallel(payload + used, capacity - used);
  write_header(payload, uint32_t(n), wb, dim, uint32_t(used));
  return int32_t(used);
}

// First failure while decoding a row: chunk -1 for the header.
struct Failure {
  Status status = kOk;
  int64_t chunk = -1;
};

template <typename U>
Failure DecodeRow(const uint8_t* payload, uint64_t capacity, uint64_t n, uint32_t dim, U* x,
                  size_t parts, bool fast) {
  constexpr uint32_t wb = sizeof(U);
  if (Status st = check_header(payload, capacity, uint32_t(n), wb, dim)) return {st, -1};
  const Runs runs{chunk_count(n), parts};
  const uint8_t* streams = payload + header_bytes(n, wb);
  std::vector<Failure> fail(parts);
  parallel_for(parts, 1, [&](size_t pb, size_t pe) {
    ChunkWork<U> work;
    for (size_t p = pb; p < pe; ++p) {
      for (uint64_t c = runs.begin(p); c < runs.begin(p + 1); ++c) {
        uint32_t begin, size;
        Status st = locate_chunk(payload, uint32_t(n), wb, c, &begin, &size);
        if (!st)
          st = DecodeChunk<U>(fast, streams + begin, size, chunk_words(n, c), dim,
                               x + c * kChunkWords, work);
        if (st) {
          fail[p] = {st, int64_t(c)};
          break;
        }
      }
    }
  });
  for (const Failure& f : fail)
    if (f.status) return f;
  return {};
}

template <typename U>
void Encode(const Batch& b, int64_t dim, const void* x, uint8_t* payload, int32_t* nbytes) {
  const uint64_t n = b.n;
  const U* words = static_cast<const U*>(x);
  const bool fast = UseFastCodec();
  ForRows(b.rows, chunk_count(n), [&](size_t r, size_t parts) {
    nbytes[r] = EncodeRow<U>(words + r * n, n, uint32_t(dim), payload + r * b.capacity, b.capacity,
                             parts, fast);
  });
}

ffi::Error EncodeImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                      ffi::Result<ffi::Buffer<ffi::S32>> nbytes,
                      ffi::Result<ffi::Buffer<ffi::U8>> scratch, int64_t dim) {
  Batch b;
  std::string why =
      check_encode_args(x, *payload, nbytes->dimensions(), scratch->dimensions(), dim, &b);
  if (!why.empty()) return Invalid("encode: " + why);
  uint8_t* p = static_cast<uint8_t*>(payload->untyped_data());
  int32_t* nb = nbytes->typed_data();
  PreferHugePages(p, payload->size_bytes());
  switch (b.wb) {
    case 2: Encode<uint16_t>(b, dim, x.untyped_data(), p, nb); break;
    case 4: Encode<uint32_t>(b, dim, x.untyped_data(), p, nb); break;
    default: Encode<uint64_t>(b, dim, x.untyped_data(), p, nb); break;
  }
  return ffi::Error::Success();
}

template <typename U>
ffi::Error Decode(const uint8_t* payload, uint64_t capacity, int64_t dim, bool strict, size_t rows,
                  uint64_t n, U* x, int32_t* status) {
  std::vector<Failure> fail(rows);
  const bool fast = UseFastCodec();
  ForRows(rows, chunk_count(n), [&](size_t r, size_t parts) {
    fail[r] = DecodeRow<U>(payload + r * capacity, capacity, n, uint32_t(dim), x + r * n, parts,
                           fast);
    status[r] = fail[r].status;
    if (fail[r].status) memset(x + r * n, 0, n * sizeof(U));
  });
  for (size_t r = 0; strict && r < rows; ++r) {
    if (!fail[r].status) continue;
    std::string where = "row " + std::to_string(r);
    if (fail[r].chunk >= 0) where += ", chunk " + std::to_string(fail[r].chunk);
    return Invalid("decode: " + where + ": " + status_message(fail[r].status));
  }
  return ffi::Error::Success();
}

ffi::Error DecodeImpl(ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                      ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t dim, int64_t strict) {
  Batch b;
  std::string why = check_decode_args(payload, *x, status->dimensions(), dim, &b);
  if (!why.empty()) return Invalid("decode: " + why);
  const uint8_t* p = static_cast<const uint8_t*>(payload.untyped_data());
  void* out = x->untyped_data();
  int32_t* st = status->typed_data();
  const bool s = strict != 0;
  PreferHugePages(out, x->size_bytes());
  switch (b.wb) {
    case 2: return Decode(p, b.capacity, dim, s, b.rows, b.n, static_cast<uint16_t*>(out), st);
    case 4: return Decode(p, b.capacity, dim, s, b.rows, b.n, static_cast<uint32_t*>(out), st);
    default: return Decode(p, b.capacity, dim, s, b.rows, b.n, static_cast<uint64_t*>(out), st);
  }
}

}  // namespace

// Host entry points (one row; the handlers' kernels and threads), for the fused MPI collectives.
uint64_t encode_host(const void* x, uint32_t wb, uint64_t n, uint32_t dim, uint8_t* payload,
                     uint64_t capacity) {
  const bool fast = UseFastCodec();
  const size_t parts = PartsFor(chunk_count(n), 1);
  switch (wb) {
    case 2: return uint64_t(EncodeRow(static_cast<const uint16_t*>(x), n, dim, payload, capacity,
                                      parts, fast));
    case 4: return uint64_t(EncodeRow(static_cast<const uint32_t*>(x), n, dim, payload, capacity,
                                      parts, fast));
    default: return uint64_t(EncodeRow(static_cast<const uint64_t*>(x), n, dim, payload,
                                       capacity, parts, fast));
  }
}

int32_t decode_host(const uint8_t* payload, uint64_t capacity, uint32_t wb, uint64_t n,
                    uint32_t dim, void* x) {
  const bool fast = UseFastCodec();
  const size_t parts = PartsFor(chunk_count(n), 1);
  switch (wb) {
    case 2: return DecodeRow(payload, capacity, n, dim, static_cast<uint16_t*>(x), parts, fast)
                .status;
    case 4: return DecodeRow(payload, capacity, n, dim, static_cast<uint32_t*>(x), parts, fast)
                .status;
    default: return DecodeRow(payload, capacity, n, dim, static_cast<uint64_t*>(x), parts, fast)
                 .status;
  }
}

}  // namespace mpc
}  // namespace jaxhc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpcEncodeCpu, jaxhc::mpc::EncodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Attr<int64_t>("dim"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpcDecodeCpu, jaxhc::mpc::DecodeImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("dim")
                                  .Attr<int64_t>("strict"));
