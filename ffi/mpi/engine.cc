// The fused MPI collectives (see engine.h): segment schedule, message exchange and fallbacks.
#include "mpi/engine.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "mpi/values.h"

namespace jaxhc {
namespace mpi {
namespace {

constexpr int kTagScatter = 0x6a01;  // phase 1: pieces to their chunk's owner
constexpr int kTagGather = 0x6a02;   // phase 2: reduced (or own) segments to every rank
constexpr uint64_t kHeader = 8;      // every message: Header, then its payload

// Flags a message carries (see engine.h "Fallbacks").
constexpr uint8_t kOkValues = 1;  // phase 1: this piece encoded; phase 2: all pieces of it encoded
constexpr uint8_t kOkReduced = 2;  // phase 2: the reduced segment encoded
constexpr uint8_t kOverBudget = 4;  // this segment, or one the sender summed, went raw over budget

struct Header {
  uint32_t bytes;  // payload bytes after the header
  uint8_t raw;     // 1: the payload is the values themselves
  uint8_t flags;
  uint16_t unused;
};
static_assert(sizeof(Header) == kHeader, "header layout");

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// A grow-only, page-aligned buffer kept across calls: first-touch page faults of fresh buffers
// cost more than the codecs on large messages (see ffi/cpu/mpc_cpu.cc).
class Buffer {
 public:
  ~Buffer() { std::free(p_); }
  uint8_t* get(size_t bytes) {
    if (bytes > cap_) {
      std::free(p_);
      cap_ = round_up(bytes, size_t{2} << 20);
      p_ = static_cast<uint8_t*>(std::aligned_alloc(size_t{2} << 20, cap_));
      if (!p_) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
      madvise(p_, cap_, MADV_HUGEPAGE);
#endif
    }
    return p_;
  }

 private:
  uint8_t* p_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace

class Workspace {
 public:
  std::mutex mu;  // one fused collective at a time per workspace (they are ordered anyway)
  Buffer send1, recv1, send2, recv2, reduced, stage;
  Buffer carried;  // error feedback: a segment's y = x + residual, then its decoded values
  Buffer sent;     // error feedback, plain: the whole y = x + residual
};

Workspace* new_workspace() { return new Workspace; }

namespace {

Workspace& workspace(const Options& opt) {
  static Workspace shared;
  return opt.workspace ? *opt.workspace : shared;
}

constexpr int kSpins = 64;       // polls before the waiting thread starts to nap
constexpr int kNapMicros = 50;   // a nap between polls while waiting

// Open MPI's TCP transport sends a message longer than its eager limit (64 KiB by default) by
// rendezvous: the receiver's clear-to-send then queues behind the data that rank is sending the other
// way on the same connection (its socket buffer and the link's queue), so a pair exchanging large
// messages both ways runs half duplex (measured on the shaped links: P = 2, 256 KiB messages, 64 MiB
// per rank: 2.08x the ring bound in the median; under the eager limit 1.06x). Every message of a
// call therefore travels as pieces of at most this many bytes, which any eager limit of 64 KiB takes
// with its headers; both ends derive the same piece count from a capacity they both know.
constexpr uint64_t kPieceBytes = 65536 - 512;

uint64_t pieces(uint64_t capacity) {
  return std::max<uint64_t>(1, (capacity + kPieceBytes - 1) / kPieceBytes);
}

// Non-blocking messages of one call, progressed together. A message is one or more MPI pieces
// (see kPieceBytes); it is done when all of them are.
class Exchange {
 public:
  explicit Exchange(MPI_Comm comm) : comm_(comm) {}
  ~Exchange() { finish(); }

  // A message of at most `capacity` bytes from `src` into buf.
  int recv(void* buf, uint64_t capacity, int src, int tag) {
    uint8_t* p = static_cast<uint8_t*>(buf);
    const uint64_t n = pieces(capacity);
    const int id = begin_message(n);
    for (uint64_t k = 0, off = 0; k < n; ++k, off += kPieceBytes) {
      uint64_t len = std::min(kPieceBytes, capacity - std::min(capacity, off));
      MPI_Irecv(p + off, static_cast<int>(len), MPI_BYTE, src, tag, comm_, add_request(id));
    }
    return id;
  }

  // `bytes` of buf to `dst`, whose receive was posted with `capacity` (>= bytes): as many pieces
  // as that receive expects, the ones past `bytes` empty.
  int send(const void* buf, uint64_t bytes, uint64_t capacity, int dst, int tag) {
    const uint8_t* p = static_cast<const uint8_t*>(buf);
    const uint64_t n = pieces(capacity);
    const int id = begin_message(n);
    for (uint64_t k = 0, off = 0; k < n; ++k, off += kPieceBytes) {
      uint64_t len = std::min(kPieceBytes, bytes - std::min(bytes, off));
      MPI_Isend(p + std::min(off, bytes), static_cast<int>(len), MPI_BYTE, dst, tag, comm_,
                add_request(id));
    }
    sent_ += static_cast<int64_t>(bytes);
    return id;
  }

  bool done(int id) const { return left_[id] == 0; }
  int64_t sent() const { return sent_; }

  // Progresses MPI; with block, until at least one piece completes. Waiting polls MPI and
  // sleeps a little in between instead of spinning: the core is left to the TCP stack and to
  // other processes (ranks sharing a host), at a cost of microseconds per message.
  void progress(bool block) {
    if (reqs_.empty()) return;
    idx_.resize(reqs_.size());
    for (int spins = 0;; ++spins) {
      int count = 0;
      MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &count, idx_.data(),
                   MPI_STATUSES_IGNORE);
      if (count == MPI_UNDEFINED) return;  // nothing left in flight
      for (int i = 0; i < count; ++i) --left_[owner_[idx_[i]]];
      if (count > 0 || !block) return;
      if (spins >= kSpins) std::this_thread::sleep_for(std::chrono::microseconds(kNapMicros));
    }
  }

  // Waits for every message (the buffers are reused by the next call).
  void finish() {
    if (!reqs_.empty())
      MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    std::fill(left_.begin(), left_.end(), 0);
  }

 private:
  int begin_message(uint64_t n) {
    left_.push_back(static_cast<int>(n));
    return static_cast<int>(left_.size() - 1);
  }
  MPI_Request* add_request(int id) {
    reqs_.emplace_back();
    owner_.push_back(id);
    return &reqs_.back();
  }

  MPI_Comm comm_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> owner_;  // request -> message
  std::vector<int> left_;   // message -> pieces not yet complete
  std::vector<int> idx_;
  int64_t sent_ = 0;
};

// Which values a chunk holds. psum / psum_scatter: chunk q is x[q * per, (q + 1) * per) with
// values at or past n reading as zero, coded as m >= per values (zero padding). all_gather: chunk
// q is rank q's row of per = m values. Chunks travel in S segments of L values (the last shorter).
struct Geometry {
  int parts = 1, me = 0;
  uint64_t n = 0, per = 0, m = 0, L = 1, S = 1;
  size_t eb = 4;

  uint64_t begin(uint64_t s) const { return s * L; }
  uint64_t count(uint64_t s) const { return std::min(L, m - s * L); }
  // Values of segment s of chunk q that exist in the flat array (the rest is padding).
  uint64_t valid(int q, uint64_t s) const {
    uint64_t lo = begin(s), hi = lo + count(s);
    uint64_t end = std::min(per, n > q * per ? n - q * per : 0);  // valid values of the chunk
    return end > lo ? std::min(hi, end) - lo : 0;
  }
  uint64_t offset(int q, uint64_t s) const { return q * per + begin(s); }  // in the flat array
};

// codec nullptr: plain (segments of any length).
Geometry make_geometry(MPI_Comm comm, Elem e, uint64_t n, uint64_t per, uint64_t m,
                       const SegmentCodec* codec, const Options& opt) {
  Geometry g;
  MPI_Comm_size(comm, &g.parts);
  MPI_Comm_rank(comm, &g.me);
  g.n = n, g.per = per, g.m = m, g.eb = elem_bytes(e);
  uint64_t a = codec ? codec->align() : 1;
  g.L = std::max(a, round_up(std::max<uint64_t>(opt.segment_bytes / g.eb, 1), a));
  g.S = std::max<uint64_t>(1, (m + g.L - 1) / g.L);
  return g;
}

// One fused call: buffers, messages and the three kinds of work (encode a segment of every chunk,
// reduce a segment of this rank's chunk, decode a gathered segment), run by the calling thread in
// that order of preference, with MPI progressed between them. codec nullptr: plain, where the
// values travel as they are, straight from x and into y where they can (no header, no copies).
class Call {
 public:
  Call(MPI_Comm comm, Elem e, SegmentCodec* codec, const Geometry& g, Workspace& w,
       const float* residual_in = nullptr, float* residual_out = nullptr)
      : e_(e), codec_(codec), g_(g), ex_(comm), w_(w), res_in_(residual_in),
        res_out_(residual_out) {
    uint64_t vals = round_up(g.L * g.eb, 8);
    slot_ = codec ? kHeader + std::max(round_up(codec->capacity(g.L), 8),
                                       codec->may_send_raw() ? vals : 0)
                  : vals;
  }

  // scatter: phase 1 from x (its P chunks), reducing this rank's chunk into `chunk` (m values).
  // gather: phase 2 of `chunk` (reduced, or given when !scatter) into y on every rank.
  void run(const void* x, uint8_t* chunk, void* y, bool scatter, bool gather);

  bool ok_values() const { return ok_values_; }
  bool ok_reduced() const { return ok_reduced_; }
  bool over_budget() const { return over_budget_; }
  int64_t sent() const { return ex_.sent(); }

 private:
  uint8_t* slot(Buffer& b, uint64_t s, int q) {
    return b.get(slot_ * g_.S * g_.parts) + (s * g_.parts + q) * slot_;
  }
  const void* source(const void* x, int q, uint64_t s);
  const float* carry(const void* x, int q, uint64_t s);
  void keep_lost(const uint8_t* msg, int q, uint64_t s, const float* y);
  uint8_t* plain_target(void* y, int q, uint64_t s);
  uint64_t encode_into(uint8_t* msg, const void* values, uint64_t count, uint8_t flags,
                       uint8_t fails);
  void send_gather(uint64_t s, const uint8_t* values, uint8_t flags);
  void encode_scatter(const void* x, uint64_t s);
  void reduce(const void* x, uint64_t s, uint8_t* chunk, bool gather);
  void decode_gathered(uint64_t s, int q, const uint8_t* chunk, void* y);

  Elem e_;
  SegmentCodec* codec_;
  Geometry g_;
  Exchange ex_;
  Workspace& w_;
  const float* res_in_;  // error feedback (codec calls only): see Options
  float* res_out_;
  uint64_t slot_;
  bool ok_values_ = true, ok_reduced_ = true, over_budget_ = false;
};

// Segment s of chunk q of x; a partial one (past the end of x) is staged with zeros behind its
// valid values, in a place of its own (a plain send reads it until the call ends).
const void* Call::source(const void* x, int q, uint64_t s) {
  const uint8_t* base = static_cast<const uint8_t*>(x) + g_.offset(q, s) * g_.eb;
  uint64_t c = g_.count(s), v = g_.valid(q, s);
  if (v == c) return base;
  uint8_t* st = w_.stage.get(g_.L * g_.eb * g_.S * g_.parts) + (s * g_.parts + q) * g_.L * g_.eb;
  std::memcpy(st, base, v * g_.eb);
  std::memset(st + v * g_.eb, 0, (c - v) * g_.eb);
  return st;
}

// Error feedback: segment s of chunk q of y = x + residual (zeros past the valid values, as the
// unfused path pads its rows), in the workspace's `carried` buffer (one segment at a time).
const float* Call::carry(const void* x, int q, uint64_t s) {
  float* y = reinterpret_cast<float*>(w_.carried.get(2 * g_.L * sizeof(float)));
  const float* xv = static_cast<const float*>(x) + g_.offset(q, s);
  const float* rv = res_in_ + g_.offset(q, s);
  uint64_t c = g_.count(s), v = g_.valid(q, s);
  {
    FlushDenormals ftz;  // XLA:CPU's add
    for (uint64_t i = 0; i < v; ++i) y[i] = xv[i] + rv[i];
  }
  std::fill(y + v, y + c, 0.0f);
  return y;
}

// Error feedback: the residual of segment s of chunk q, y minus what its message `msg` decodes to
// (a raw message: y itself, so y - y). A failed encode writes nothing: the call then goes plain.
void Call::keep_lost(const uint8_t* msg, int q, uint64_t s, const float* y) {
  Header h;
  std::memcpy(&h, msg, kHeader);
  if (!(h.flags & kOkValues)) return;
  uint64_t c = g_.count(s), v = g_.valid(q, s);
  float* dec = reinterpret_cast<float*>(w_.carried.get(2 * g_.L * sizeof(float))) + g_.L;
  const float* got = y;
  if (!h.raw) {
    if (!codec_->decode(msg + kHeader, h.bytes, e_, c, dec)) {
      ok_values_ = false;  // malformed: the call goes plain
      return;
    }
    got = dec;
  }
  float* out = res_out_ + g_.offset(q, s);
  FlushDenormals ftz;  // XLA:CPU's subtraction
  for (uint64_t i = 0; i < v; ++i) out[i] = y[i] - got[i];
}

// Where a plain gathered segment lands: in y when it is whole there, else in a slot.
uint8_t* Call::plain_target(void* y, int q, uint64_t s) {
  if (g_.valid(q, s) == g_.count(s)) return static_cast<uint8_t*>(y) + g_.offset(q, s) * g_.eb;
  return slot(w_.recv2, s, q);
}

// Writes header and payload of one message; returns its size. A lossy codec that meets a
// non-finite value sends the flags alone, with `fails` cleared.
uint64_t Call::encode_into(uint8_t* msg, const void* values, uint64_t count, uint8_t flags,
                           uint8_t fails) {
  Header h{0, 0, flags, 0};
  uint64_t bytes = 0;
  switch (codec_->encode(values, e_, count, msg + kHeader, &bytes)) {
    case SegmentCodec::kCoded:
      h.bytes = static_cast<uint32_t>(bytes);
      break;
    case SegmentCodec::kOverBudget:
      h.flags |= kOverBudget;
      [[fallthrough]];
    case SegmentCodec::kRaw:
      h.raw = 1;
      h.bytes = static_cast<uint32_t>(count * g_.eb);
      std::memcpy(msg + kHeader, values, h.bytes);
      break;
    case SegmentCodec::kFail:
      h.flags = static_cast<uint8_t>(flags & ~fails);
      break;
  }
  std::memcpy(msg, &h, kHeader);
  return kHeader + h.bytes;
}

void Call::send_gather(uint64_t s, const uint8_t* values, uint8_t flags) {
  if (!codec_) {
    for (int r = 1; r < g_.parts; ++r)
      ex_.send(values, g_.count(s) * g_.eb, g_.count(s) * g_.eb, (g_.me + r) % g_.parts,
               kTagGather);
    return;
  }
  uint8_t* msg = slot(w_.send2, s, 0);
  uint64_t size = kHeader;
  if (flags & kOkValues) {
    size = encode_into(msg, values, g_.count(s), flags, kOkReduced);
  } else {
    Header h{0, 0, flags, 0};
    std::memcpy(msg, &h, kHeader);
  }
  for (int r = 1; r < g_.parts; ++r) ex_.send(msg, size, slot_, (g_.me + r) % g_.parts, kTagGather);
}

void Call::encode_scatter(const void* x, uint64_t s) {
  for (int r = 0; r < g_.parts; ++r) {  // my own piece first, then the others in ring order
    int q = (g_.me + r) % g_.parts;
    if (!codec_) {
      if (q != g_.me)
        ex_.send(source(x, q, s), g_.count(s) * g_.eb, g_.count(s) * g_.eb, q, kTagScatter);
      continue;
    }
    uint8_t* msg = slot(w_.send1, s, q);
    const void* values = res_in_ ? carry(x, q, s) : source(x, q, s);
    uint64_t size = encode_into(msg, values, g_.count(s), kOkValues, kOkValues);
    if (q != g_.me) ex_.send(msg, size, slot_, q, kTagScatter);
    if (res_in_) keep_lost(msg, q, s, static_cast<const float*>(values));  // while it travels
  }
}

void Call::reduce(const void* x, uint64_t s, uint8_t* chunk, bool gather) {
  uint8_t* out = chunk + g_.begin(s) * g_.eb;
  if (!codec_) {
    std::vector<const void*> in(g_.parts);
    for (int q = 0; q < g_.parts; ++q)
      in[q] = q == g_.me ? source(x, q, s) : slot(w_.recv1, s, q);
    sum_in_rank_order(in.data(), g_.parts, e_, g_.count(s), out);
    if (gather) send_gather(s, out, kOkValues | kOkReduced);
    return;
  }
  std::vector<const uint8_t*> in(g_.parts);
  std::vector<uint64_t> bytes(g_.parts);
  std::unique_ptr<bool[]> raw(new bool[g_.parts]);
  bool ok = true;
  uint8_t over = 0;
  for (int q = 0; q < g_.parts; ++q) {
    const uint8_t* msg = q == g_.me ? slot(w_.send1, s, q) : slot(w_.recv1, s, q);
    Header h;
    std::memcpy(&h, msg, kHeader);
    ok &= (h.flags & kOkValues) != 0;
    over |= h.flags & kOverBudget;
    in[q] = msg + kHeader, bytes[q] = h.bytes, raw[q] = h.raw != 0;
  }
  if (ok)  // a malformed piece counts as a failed encode: the call goes plain
    ok = codec_->decode_sum(in.data(), bytes.data(), raw.get(), g_.parts, e_, g_.count(s), out);
  ok_values_ &= ok;
  over_budget_ |= over != 0;
  if (gather) send_gather(s, out, static_cast<uint8_t>((ok ? kOkValues | kOkReduced : 0) | over));
}

void Call::decode_gathered(uint64_t s, int q, const uint8_t* chunk, void* y) {
  if (!codec_) {  // only copies: my own segment, or one that arrived in a slot
    uint64_t v = g_.valid(q, s);
    uint8_t* dst = static_cast<uint8_t*>(y) + g_.offset(q, s) * g_.eb;
    const uint8_t* from = q == g_.me ? chunk + g_.begin(s) * g_.eb : plain_target(y, q, s);
    if (v && from != dst) std::memcpy(dst, from, v * g_.eb);
    return;
  }
  const uint8_t* msg = q == g_.me ? slot(w_.send2, s, 0) : slot(w_.recv2, s, q);
  Header h;
  std::memcpy(&h, msg, kHeader);
  ok_values_ &= (h.flags & kOkValues) != 0;
  ok_reduced_ &= (h.flags & kOkReduced) != 0;
  over_budget_ |= (h.flags & kOverBudget) != 0;
  uint64_t c = g_.count(s), v = g_.valid(q, s);
  if ((h.flags & (kOkValues | kOkReduced)) != (kOkValues | kOkReduced) || !v) return;
  uint8_t* dst = static_cast<uint8_t*>(y) + g_.offset(q, s) * g_.eb;
  uint8_t* to = v == c ? dst : w_.stage.get(g_.L * g_.eb);
  if (h.raw)
    std::memcpy(to, msg + kHeader, c * g_.eb);
  else if (!codec_->decode(msg + kHeader, h.bytes, e_, c, to))
    ok_reduced_ = false;  // malformed: the gather phase goes plain
  if (to != dst) std::memcpy(dst, to, v * g_.eb);
}

void Call::run(const void* x, uint8_t* chunk, void* y, bool scatter, bool gather) {
  const int P = g_.parts;
  const uint64_t S = g_.S;
  std::vector<int> recv1(S * P, -1), recv2(S * P, -1);
  for (uint64_t s = 0; s < S; ++s)
    for (int r = 1; r < P; ++r) {
      int q = (g_.me + P - r) % P;
      if (scatter)  // a plain piece is exactly its values; a coded one at most a slot
        recv1[s * P + q] = ex_.recv(slot(w_.recv1, s, q), codec_ ? slot_ : g_.count(s) * g_.eb, q,
                                    kTagScatter);
      if (gather)
        recv2[s * P + q] = codec_ ? ex_.recv(slot(w_.recv2, s, q), slot_, q, kTagGather)
                                  : ex_.recv(plain_target(y, q, s), g_.count(s) * g_.eb, q,
                                             kTagGather);
    }
  uint64_t encoded = 0, reduced = 0;
  if (!scatter) {  // all_gather: this rank's chunk is given
    for (uint64_t s = 0; s < S; ++s) {
      send_gather(s, chunk + g_.begin(s) * g_.eb, kOkValues | kOkReduced);
      ex_.progress(false);
    }
    encoded = reduced = S;
  }
  std::vector<bool> decoded(S * P, false);
  uint64_t left = gather ? S * P : 0, scan = 0;  // scan: no undecoded segment below it
  while (true) {
    ex_.progress(false);
    if (reduced < encoded) {  // reduce the next segment once all its pieces are here
      bool all = true;
      for (int q = 0; q < P && all; ++q) all = q == g_.me || ex_.done(recv1[reduced * P + q]);
      if (all) {
        reduce(x, reduced++, chunk, gather);
        continue;
      }
    }
    if (encoded < S) {
      encode_scatter(x, encoded++);
      continue;
    }
    bool worked = false;
    for (uint64_t i = scan * P; i < reduced * P && gather && !worked; ++i) {
      int q = static_cast<int>(i % P);
      if (decoded[i] || (q != g_.me && !ex_.done(recv2[i]))) continue;
      decode_gathered(i / P, q, chunk, y);
      decoded[i] = worked = true;
      --left;
    }
    while (scan < reduced && std::all_of(decoded.begin() + scan * P,
                                         decoded.begin() + (scan + 1) * P, [](bool d) { return d; }))
      ++scan;
    if (worked) continue;
    if (reduced == S && left == 0) break;
    ex_.progress(true);
  }
  ex_.finish();
}

uint64_t chunk_values(uint64_t n, int parts) {
  return (std::max<uint64_t>(n, 1) + parts - 1) / parts;
}

int comm_size(MPI_Comm comm) {
  int p;
  MPI_Comm_size(comm, &p);
  return p;
}

// The agreement of psum_scatter (whose ranks see only the pieces sent to them): bit 0 set when
// some rank's values could not be encoded, bit 1 when some rank's segment went over budget.
int any_rank(MPI_Comm comm, int bits) {
  int all = 0;
  MPI_Allreduce(&bits, &all, 1, MPI_INT, MPI_BOR, comm);
  return all;
}

// Runs one collective (scatter and/or gather) with `codec`, then returns its flags and traffic.
struct Outcome {
  bool ok_values, ok_reduced, over_budget;
};

Outcome run_call(MPI_Comm comm, Elem e, SegmentCodec* codec, const Geometry& g, Workspace& w,
                 const void* x, uint8_t* chunk, void* y, bool scatter, bool gather, Stats* stats,
                 const Options* feedback = nullptr) {
  Call call(comm, e, codec, g, w, feedback ? feedback->residual_in : nullptr,
            feedback ? feedback->residual_out : nullptr);
  call.run(x, chunk, y, scatter, gather);
  stats->wire_bytes += call.sent();
  if (call.over_budget()) stats->fallback = 1;
  return {call.ok_values(), call.ok_reduced(), call.over_budget()};
}

}  // namespace

std::string psum(MPI_Comm comm, Elem e, const void* x, uint64_t n, void* y, SegmentCodec* codec,
                 const Options& opt, Stats* stats) {
  const int P = comm_size(comm);
  const uint64_t per = chunk_values(n, P);
  const size_t eb = elem_bytes(e);
  Workspace& w = workspace(opt);
  std::lock_guard<std::mutex> lock(w.mu);
  Geometry pg = make_geometry(comm, e, n, per, per, nullptr, opt);
  if (codec) {
    Geometry g = make_geometry(comm, e, n, per, round_up(per, 4), codec, opt);
    uint8_t* chunk = w.reduced.get(g.m * eb);
    Outcome o = run_call(comm, e, codec, g, w, x, chunk, y, true, true, stats);
    if (o.ok_values && o.ok_reduced) return "";
    stats->fallback = 1;
    if (o.ok_values) {  // a reduced chunk is not finite: gather the sums as they are
      run_call(comm, e, nullptr, pg, w, nullptr, chunk, y, false, true, stats);
      return "";
    }
  }
  // Plain: this rank's sums go straight into y when its chunk lies wholly inside it.
  uint8_t* chunk = (pg.me + 1) * per <= n ? static_cast<uint8_t*>(y) + pg.me * per * eb
                                          : w.reduced.get(per * eb);
  run_call(comm, e, nullptr, pg, w, x, chunk, y, true, true, stats);
  return "";
}

std::string psum_scatter(MPI_Comm comm, Elem e, const void* x, uint64_t per, void* y,
                         SegmentCodec* codec, const Options& opt, Stats* stats) {
  const int P = comm_size(comm);
  const size_t eb = elem_bytes(e);
  const bool feedback = opt.residual_in != nullptr;
  if (feedback && (e != Elem::kF32 || opt.residual_out == nullptr))
    return "error feedback takes float32 values and both residuals";
  Workspace& w = workspace(opt);
  std::lock_guard<std::mutex> lock(w.mu);
  if (codec) {
    Geometry g = make_geometry(comm, e, P * per, per, round_up(per, 4), codec, opt);
    uint8_t* chunk = w.reduced.get(g.m * eb);
    Outcome o = run_call(comm, e, codec, g, w, x, chunk, nullptr, true, false, stats,
                         feedback ? &opt : nullptr);
    stats->wire_bytes += 4 * (P - 1);  // the agreement
    int bits = any_rank(comm, (o.ok_values ? 0 : 1) | (o.over_budget ? 2 : 0));
    stats->fallback = bits != 0;
    if (!(bits & 1)) {
      std::memcpy(y, chunk, per * eb);
      return "";
    }
  }
  if (feedback) {  // y = x + residual travels as it is: nothing is lost (zeros, as kept())
    const uint64_t n = P * per;
    float* sent = reinterpret_cast<float*>(w.sent.get(n * sizeof(float)));
    const float* xv = static_cast<const float*>(x);
    {
      FlushDenormals ftz;
      for (uint64_t i = 0; i < n; ++i) sent[i] = xv[i] + opt.residual_in[i];
    }
    std::fill(opt.residual_out, opt.residual_out + n, 0.0f);
    x = sent;
  }
  Geometry pg = make_geometry(comm, e, P * per, per, per, nullptr, opt);
  run_call(comm, e, nullptr, pg, w, x, static_cast<uint8_t*>(y), nullptr, true, false, stats);
  return "";
}

std::string all_gather(MPI_Comm comm, Elem e, const void* x, uint64_t k, void* y,
                       SegmentCodec* codec, const Options& opt, Stats* stats) {
  const int P = comm_size(comm);
  Workspace& w = workspace(opt);
  std::lock_guard<std::mutex> lock(w.mu);
  uint8_t* own = const_cast<uint8_t*>(static_cast<const uint8_t*>(x));  // read, never written
  if (codec) {
    Geometry g = make_geometry(comm, e, P * k, k, k, codec, opt);
    Outcome o = run_call(comm, e, codec, g, w, nullptr, own, y, false, true, stats);
    if (o.ok_values && o.ok_reduced) return "";
    stats->fallback = 1;
  }
  Geometry pg = make_geometry(comm, e, P * k, k, k, nullptr, opt);
  run_call(comm, e, nullptr, pg, w, nullptr, own, y, false, true, stats);
  return "";
}

}  // namespace mpi
}  // namespace jaxhc
