// Python module _jaxhc_mpi: the fused MPI collectives as XLA FFI handlers (CPU). Built when CMake
// finds an MPI library; it must be the one mpi4py runs on (the communicator handles are its).
//
//   jaxhc_mpi_psum          x: F32|F64|BF16 [n], token -> y [n], stats: S32 [3], token
//   jaxhc_mpi_psum_scatter  x [P * per], token        -> y [per], stats, token
//   jaxhc_mpi_all_gather    x [k], token              -> y [P * k], stats, token
//   attrs: comm (the MPI_Comm handle, as mpi4py's _handleof gives it), codec (0 plain, 1 zfp,
//          2 mpc), maxbits (zfp), dim (zfp: its block dims 1..3; mpc: its dimension), budget
//          (mpc; <= 0: none), segment_bytes
//   stats: S32 [3] = the bytes this rank sent, as its low 31 bits and the rest, and 1 if the
//          call fell back (see engine.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <memory>
#include <string>

#include "mpi/codecs.h"
#include "mpi/engine.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace jaxhc {
namespace mpi {
namespace {

enum CodecId : int64_t { kPlain = 0, kZfp = 1, kMpc = 2 };

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
  int64_t segment_bytes;
};

ffi::Error Run(const char* op, Fn fn, ffi::AnyBuffer x, ffi::AnyBuffer y,
               ffi::Buffer<ffi::S32> stats, const Attrs& a, uint64_t count) {
  Elem e;
  if (!to_elem(x.element_type(), &e) || y.element_type() != x.element_type())
    return ffi::Error::InvalidArgument(std::string(op) + ": values must be float32, float64 or "
                                       "bfloat16, the same type in and out");
  if (stats.element_count() != 3)
    return ffi::Error::InvalidArgument(std::string(op) + ": stats must hold 3 int32");
  std::unique_ptr<SegmentCodec> c;
  if (a.codec == kZfp && (a.dim < 1 || a.dim > 3))
    return ffi::Error::InvalidArgument(std::string(op) + ": zfp dims " + std::to_string(a.dim) +
                                       " is not 1, 2 or 3");
  if (a.codec == kZfp)
    c = std::make_unique<ZfpSegments>(static_cast<int>(a.maxbits), static_cast<int>(a.dim));
  else if (a.codec == kMpc)
    c = std::make_unique<MpcSegments>(static_cast<int>(a.dim), a.budget);
  else if (a.codec != kPlain)
    return ffi::Error::InvalidArgument(std::string(op) + ": unknown codec " +
                                       std::to_string(a.codec));
  Options opt;
  if (a.segment_bytes > 0) opt.segment_bytes = static_cast<uint64_t>(a.segment_bytes);
  Stats st;
  std::string err = fn(to_comm(a.comm), e, x.untyped_data(), count, y.untyped_data(), c.get(),
                       opt, &st);
  if (!err.empty()) return ffi::Error::Internal(std::string(op) + ": " + err);
  stats.typed_data()[0] = static_cast<int32_t>(st.wire_bytes & 0x7fffffff);
  stats.typed_data()[1] = static_cast<int32_t>(st.wire_bytes >> 31);
  stats.typed_data()[2] = static_cast<int32_t>(st.fallback);
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
                    int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, segment_bytes};
  if (y->element_count() != x.element_count())
    return ffi::Error::InvalidArgument("jaxhc_mpi_psum: y must have as many values as x");
  return Run("jaxhc_mpi_psum", &psum, x, *y, *stats, a, x.element_count());
}

ffi::Error PsumScatterImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                           ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>,
                           int64_t comm, int64_t codec, int64_t maxbits, int64_t dim,
                           double budget, int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, segment_bytes};
  uint64_t per = y->element_count();
  if (x.element_count() != per * CommSize(comm))
    return ffi::Error::InvalidArgument("jaxhc_mpi_psum_scatter: x must hold P * y values");
  return Run("jaxhc_mpi_psum_scatter", &psum_scatter, x, *y, *stats, a, per);
}

ffi::Error AllGatherImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Buffer<ffi::S32>> stats, ffi::Result<ffi::Token>,
                         int64_t comm, int64_t codec, int64_t maxbits, int64_t dim,
                         double budget, int64_t segment_bytes) {
  const Attrs a{comm, codec, maxbits, dim, budget, segment_bytes};
  uint64_t k = x.element_count();
  if (y->element_count() != k * CommSize(comm))
    return ffi::Error::InvalidArgument("jaxhc_mpi_all_gather: y must hold P * x values");
  return Run("jaxhc_mpi_all_gather", &all_gather, x, *y, *stats, a, k);
}

}  // namespace
}  // namespace mpi
}  // namespace jaxhc

#define JAXHC_MPI_BIND                      \
  ffi::Ffi::Bind()                          \
      .Arg<ffi::AnyBuffer>()                \
      .Arg<ffi::Token>()                    \
      .Ret<ffi::AnyBuffer>()                \
      .Ret<ffi::Buffer<ffi::S32>>()         \
      .Ret<ffi::Token>()                    \
      .Attr<int64_t>("comm")                \
      .Attr<int64_t>("codec")               \
      .Attr<int64_t>("maxbits")             \
      .Attr<int64_t>("dim")                 \
      .Attr<double>("budget")               \
      .Attr<int64_t>("segment_bytes")

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiPsum, jaxhc::mpi::PsumImpl, JAXHC_MPI_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiPsumScatter, jaxhc::mpi::PsumScatterImpl, JAXHC_MPI_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpiAllGather, jaxhc::mpi::AllGatherImpl, JAXHC_MPI_BIND);

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
    return d;
  });
  m.def("library_version", []() {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    return std::string(v, len);
  }, "The MPI library this module was built against (must be the one mpi4py uses).");
}
