// Python module _jaxhc_mpi: the fused MPI collectives as XLA FFI handlers (CPU). Built when CMake
// finds an MPI library; it must be the one mpi4py runs on (the communicator handles are its).
//
//   jaxhc_mpi_psum          x: F32|F64|BF16 [n], token -> y [n], stats: S32 [3], token
//   jaxhc_mpi_psum_scatter  x [P * per], token        -> y [per], stats, token
//   jaxhc_mpi_all_gather    x [k], token              -> y [P * k], stats, token
//   jaxhc_mpi_psum_scatter_ef  x: F32 [P * per], residual: F32 [P * per], token
//                              -> y [per], new residual: F32 [P * per], stats, token
//                              (error feedback, see engine.h Options)
//   attrs: comm (the MPI_Comm handle, as mpi4py's _handleof gives it), codec (0 plain, 1 zfp,
//          2 mpc, 3 quant, 4 rotated quant), maxbits (zfp), dim (zfp: its block dims 1..3; mpc:
//          its dimension), budget (mpc; <= 0: none), bits and block (quant: bits per code, values
//          per block), segment_bytes
//   stats: S32 [3] = the bytes this rank sent, as its low 31 bits and the rest, and 1 if the
//          call fell back (see engine.h).
//
// Asynchronous (ffi/mpi/queue.h): the same calls started on a progress thread, finished later.
//   jaxhc_mpi_start  x [n], token -> handle: F32 [1] (the call's ticket), token
//                    attrs: those above and op (0 psum, 1 psum_scatter, 2 all_gather,
//                    3 psum_scatter with error feedback: x is F32 [2 * P * per], the values
//                    then the residual)
//   jaxhc_mpi_done   handle, token -> y (as the synchronous call's; op 3: F32 [per + P * per],
//                    the reduced row then the new residual), stats, token
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/quant_rotated.h"
#include "mpi/codecs.h"
#include "mpi/engine.h"
#include "mpi/queue.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace jaxhc {
namespace mpi {
namespace {

enum CodecId : int64_t { kPlain = 0, kZfp = 1, kMpc = 2, kQuant = 3, kQuantRotated = 4 };

MPI_Comm to_comm(int64_t handle) {
  MPI_Comm c;
  std::memcpy(&c, &handle, sizeof c);
  return c;
}

bool to_elem(ffi::DataType t, Elem* e) {
  switch (t) {
    case ffi::DataType::F32: *e = Elem::kF32; return true;
    case ffi::DataType::F64: *e = Elem::kF64; return true;
    case ffi::DataType::BF16: *e = Elem::kBF16; return true;
    default: return false;
  }
}

using Fn = std::string (*)(MPI_Comm, Elem, const void*, uint64_t, void*, SegmentCodec*,
                           const Options&, Stats*);

// The attributes every handler takes.
struct Attrs {
  int64_t comm, codec, maxbits, dim;
  double budget;
  int64_t bits, block, segment_bytes;
};

// The block quantizer of `a` for values of type e into *out; "" or why not.
std::string MakeQuant(const Attrs& a, Elem e, std::unique_ptr<SegmentCodec>* out) {
  const bool rotate = a.codec == kQuantRotated;
  if (!QuantSegments::supports(e)) return "quant codecs take float32 or bfloat16 values";
  if (!quant::valid_bits(a.bits)) return "quant bits " + std::to_string(a.bits) + " is not 8 or 4";
  if (rotate ? !quant::valid_rotated_block(a.block) : !quant::valid_block(a.block))
    return "quant block " + std::to_string(a.block) + " is not valid" +
           (rotate ? " for a rotated codec (a power of two in 64..1024)" : "");
  quant::Kernel k;
  try {
    k = quant::active_kernel();
  } catch (const std::invalid_argument& err) {
    return err.what();
  }
  *out = std::make_unique<QuantSegments>(static_cast<int>(a.bits),
                                         static_cast<uint64_t>(a.block), rotate, k);
  return "";
}

// The codec of `a` (nullptr: plain) for values of type e into *out; "" or why not.
std::string MakeCodec(const Attrs& a, Elem e, std::unique_ptr<SegmentCodec>* out) {
  if (a.codec == kZfp && (a.dim < 1 || a.dim > 3))
    return "zfp dims " + std::to_string(a.dim) + " is not 1, 2 or 3";
  if (a.codec == kZfp)
    *out = std::make_unique<ZfpSegments>(static_cast<int>(a.maxbits), static_cast<int>(a.dim));
  else if (a.codec == kMpc)
    *out = std::make_unique<MpcSegments>(static_cast<int>(a.dim), a.budget);
  else if (a.codec == kQuant || a.codec == kQuantRotated)
    return MakeQuant(a, e, out);
  else if (a.codec != kPlain)
    return "unknown codec " + std::to_string(a.codec);
  return "";
}

Options MakeOptions(const Attrs& a) {
  Options opt;
  if (a.segment_bytes > 0) opt.segment_bytes = static_cast<uint64_t>(a.segment_bytes);
  return opt;
}

std::string CheckTypes(ffi::DataType in, ffi::DataType out, Elem* e) {
  if (!to_elem(in, e) || out != in)
    return "values must be float32, float64 or bfloat16, the same type in and out";
  return "";
}

void WriteStats(const Stats& st, ffi::Buffer<ffi::S32> stats) {
  stats.typed_data()[0] = static_cast<int32_t>(st.wire_bytes & 0x7fffffff);
  stats.typed_data()[1] = static_cast<int32_t>(st.wire_bytes >> 31);
  stats.typed_data()[2] = static_cast<int32_t>(st.fallback);
}

ffi::Error Run(const char* op, Fn fn, ffi::AnyBuffer x, ffi::AnyBuffer y,
               ffi::Buffer<ffi::S32> stats, const Attrs& a, uint64_t count,
               Options opt) {
  Elem e;
  std::string err = CheckTypes(x.element_type(), y.element_type(), &e);
  if (err.empty() && stats.element_count() != 3) err = "stats must hold 3 int32";
  std::unique_ptr<SegmentCodec> c;
  if (err.empty()) err = MakeCodec(a, e, &c);
  if (!err.empty()) return ffi::Error::InvalidArgument(std::string(op) + ": " + err);
  Stats st;
  err = fn(to_comm(a.comm), e, x.untyped_data(), count, y.untyped_data(), c.get(), opt, &st);
  if (!err.empty()) return ffi::Error::Internal(std::string(op) + ": " + err);
  WriteStats(st, stats);
  return ffi::Error::Success();
}

int CommSize(int64_t comm) {
  int p = 1;
  MPI_Comm_size(to_comm(comm), &p);
  return p;
}

ffi::Error PsumImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>,
                    int64_t comm, int64_t codec, int64_t maxbits, int64_t dim, double budget,
                    int64_t bits, int64_t block, int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, bits, block, segment_bytes};
  if (y->element_count() != x.element_count())
    return ffi::Error::InvalidArgument("jaxhc_mpi_psum: y must have as many values as x");
  return Run("jaxhc_mpi_psum", &psum, x, *y, *stats, a, x.element_count(), MakeOptions(a));
}

ffi::Error PsumScatterImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                           ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>,
                           int64_t comm, int64_t codec, int64_t maxbits, int64_t dim,
                           double budget, int64_t bits, int64_t block, int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, bits, block, segment_bytes};
  uint64_t per = y->element_count();
  if (x.element_count() != per * CommSize(comm))
    return ffi::Error::InvalidArgument("jaxhc_mpi_psum_scatter: x must hold P * y values");
  return Run("jaxhc_mpi_psum_scatter", &psum_scatter, x, *y, *stats, a, per, MakeOptions(a));
}

ffi::Error AllGatherImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>,
                         int64_t comm, int64_t codec, int64_t maxbits, int64_t dim,
                         double budget, int64_t bits, int64_t block, int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, bits, block, segment_bytes};
  uint64_t k = x.element_count();
  if (y->element_count() != k * CommSize(comm))
    return ffi::Error::InvalidArgument("jaxhc_mpi_all_gather: y must hold P * x values");
  return Run("jaxhc_mpi_all_gather", &all_gather, x, *y, *stats, a, k, MakeOptions(a));
}

ffi::Error PsumScatterEfImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::F32> residual, ffi::Token,
                             ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::Buffer<ffi::F32>> new_residual,
                             ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>,
                             int64_t comm, int64_t codec, int64_t maxbits, int64_t dim,
                             double budget, int64_t bits, int64_t block, int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, bits, block, segment_bytes};
  const char* op = "jaxhc_mpi_psum_scatter_ef";
  uint64_t per = y->element_count(), n = x.element_count();
  if (x.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument(std::string(op) + ": x must be float32");
  if (n != per * CommSize(comm) || residual.element_count() != n ||
      new_residual->element_count() != n)
    return ffi::Error::InvalidArgument(std::string(op) +
                                       ": x and both residuals must hold P * y values");
  Options opt = MakeOptions(a);
  opt.residual_in = residual.typed_data();
  opt.residual_out = new_residual->typed_data();
  return Run(op, &psum_scatter, x, *y, *stats, a, per, opt);
}

enum OpId : int64_t { kPsumOp = 0, kPsumScatterOp = 1, kAllGatherOp = 2, kFeedbackOp = 3 };

// The started psum_scatter with error feedback: `in` holds the values then the residual (n each),
// `y` gets the reduced row (n / P values) then the new residual (n).
Work FeedbackWork(MPI_Comm mc, uint64_t n, uint64_t per, std::shared_ptr<SegmentCodec> c,
                  const Options& opt) {
  return [mc, n, per, c, opt](const void* in, void* y, Workspace* w, Stats* st) {
    Options o = opt;
    o.workspace = w;
    o.residual_in = static_cast<const float*>(in) + n;
    o.residual_out = static_cast<float*>(y) + per;
    return psum_scatter(mc, Elem::kF32, in, per, y, c.get(), o, st);
  };
}

ffi::Error StartImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::Buffer<ffi::F32>> handle,
                     ffi::Result<ffi::Token>, int64_t comm, int64_t op, int64_t codec,
                     int64_t maxbits, int64_t dim, double budget, int64_t bits, int64_t block,
                     int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, bits, block, segment_bytes};
  auto fail = [](const std::string& why) {
    return ffi::Error::InvalidArgument("jaxhc_mpi_start: " + why);
  };
  Elem e;
  std::string err = CheckTypes(x.element_type(), x.element_type(), &e);
  if (!err.empty()) return fail(err);
  if (handle->element_count() != 1) return fail("the handle must be one float32");
  std::shared_ptr<SegmentCodec> c;
  {
    std::unique_ptr<SegmentCodec> made;
    if (!(err = MakeCodec(a, e, &made)).empty()) return fail(err);
    c = std::move(made);
  }
  const uint64_t n = x.element_count(), P = static_cast<uint64_t>(CommSize(comm));
  Fn fn;
  uint64_t count, out;
  switch (op) {
    case kPsumOp: fn = &psum, count = n, out = n; break;
    case kPsumScatterOp:
      if (n % P) return fail("x must hold P * y values");
      fn = &psum_scatter, count = n / P, out = n / P;
      break;
    case kAllGatherOp: fn = &all_gather, count = n, out = n * P; break;
    case kFeedbackOp:
      if (e != Elem::kF32 || n % (2 * P)) return fail("x must hold 2 * P * per float32 values");
      fn = nullptr, count = n / 2 / P, out = count + n / 2;
      break;
    default: return fail("unknown op " + std::to_string(op));
  }
  const MPI_Comm mc = to_comm(comm);
  const Options opt = MakeOptions(a);
  Work work = fn ? Work([fn, mc, e, count, c, opt](const void* in, void* y, Workspace* w,
                                                   Stats* st) {
    Options o = opt;
    o.workspace = w;
    return fn(mc, e, in, count, y, c.get(), o, st);
  })
                 : FeedbackWork(mc, n / 2, count, c, opt);
  const size_t eb = elem_bytes(e);
  int32_t ticket = start(mc, x.untyped_data(), n * eb, out * eb, std::move(work));
  handle->typed_data()[0] = static_cast<float>(ticket);
  return ffi::Error::Success();
}

ffi::Error DoneImpl(ffi::Buffer<ffi::F32> handle, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>) {
  if (handle.element_count() != 1 || stats->element_count() != 3)
    return ffi::Error::InvalidArgument("jaxhc_mpi_done: a one-float32 handle, 3 int32 stats");
  Stats st;
  const int32_t ticket = static_cast<int32_t>(handle.typed_data()[0]);
  std::string err = done(ticket, y->untyped_data(), y->size_bytes(), &st);
  if (!err.empty()) return ffi::Error::Internal("jaxhc_mpi_done: " + err);
  WriteStats(st, *stats);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace mpi
}  // namespace jaxhc

// The codec attributes every handler but done takes, after "comm" (and start's "op").
#define JAXHC_MPI_CODEC_ATTRS               \
  .Attr<int64_t>("codec")                   \
      .Attr<int64_t>("maxbits")             \
      .Attr<int64_t>("dim")                 \
      .Attr<double>("budget")               \
      .Attr<int64_t>("bits")                \
      .Attr<int64_t>("block")               \
      .Attr<int64_t>("segment_bytes")

#define JAXHC_MPI_BIND                      \
  ffi::Ffi::Bind()                          \
      .Arg<ffi::AnyBuffer>()                \
      .Arg<ffi::Token>()                    \
      .Ret<ffi::AnyBuffer>()                \
      .Ret<ffi::Buffer<ffi::S32>>()         \
      .Ret<ffi::Token>()                    \
      .Attr<int64_t>("comm") JAXHC_MPI_CODEC_ATTRS

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiPsum, jaxhc::mpi::PsumImpl, JAXHC_MPI_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiPsumScatter, jaxhc::mpi::PsumScatterImpl, JAXHC_MPI_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiAllGather, jaxhc::mpi::AllGatherImpl, JAXHC_MPI_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiPsumScatterEf, jaxhc::mpi::PsumScatterEfImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm") JAXHC_MPI_CODEC_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiStart, jaxhc::mpi::StartImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("op") JAXHC_MPI_CODEC_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiDone, jaxhc::mpi::DoneImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Token>());

namespace {
template <typename T>
nb::capsule Capsule(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_jaxhc_mpi, m) {
  m.doc() = "jaxhc fused MPI collectives (compressed psum / psum_scatter / all_gather)";
  m.def("registrations", []() {
    nb::dict d;
    d["jaxhc_mpi_psum"] = Capsule(JaxhcMpiPsum);
    d["jaxhc_mpi_psum_scatter"] = Capsule(JaxhcMpiPsumScatter);
    d["jaxhc_mpi_all_gather"] = Capsule(JaxhcMpiAllGather);
    d["jaxhc_mpi_psum_scatter_ef"] = Capsule(JaxhcMpiPsumScatterEf);
    d["jaxhc_mpi_start"] = Capsule(JaxhcMpiStart);
    d["jaxhc_mpi_done"] = Capsule(JaxhcMpiDone);
    return d;
  });
  m.def("async_ready", &jaxhc::mpi::async_ready,
        "Whether jaxhc_mpi_start runs calls on progress threads (MPI_THREAD_MULTIPLE, and "
        "JAXHC_MPI_ASYNC is not 0); otherwise it runs them itself.");
  m.def("outstanding", &jaxhc::mpi::outstanding,
        "How many started calls are not yet done (0 after every step: each start has its "
        "done).");
  m.def("library_version", []() {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    return std::string(v, len);
  }, "The MPI library this module was built against (must be the one mpi4py uses).");
}
