// Python module _jaxhc_cpu: the CPU FFI handlers and the payload-size formulas of each codec's format.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/mpc.h"
#include "core/quant.h"
#include "core/quant_rotated.h"
#include "core/zfp.h"
#include "cpu/handlers.h"
#include "cpu/parallel.h"
#include "cpu/quant_kernels.h"
#include "cpu/zfp_kernels.h"

namespace nb = nanobind;

namespace {
template <typename T>
nb::capsule Capsule(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

using Values = nb::ndarray<nb::numpy, nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void check_maxbits(bool f64, int maxbits, int dims) {
  bool ok = f64 ? jaxhc::zfp::valid_maxbits<double>(maxbits, dims)
                : jaxhc::zfp::valid_maxbits<float>(maxbits, dims);
  if (!ok)
    throw std::invalid_argument("zfp maxbits " + std::to_string(maxbits) + " is out of range in " +
                                std::to_string(dims) + "-D (dims 1..3)");
}

bool is_f64(nb::dlpack::dtype t) {
  if (t == nb::dtype<double>()) return true;
  if (t == nb::dtype<float>()) return false;
  throw std::invalid_argument("zfp takes float32 or float64 values");
}

// (stream bytes, finite) of a 1-D float array: the same stream as the jaxhc_zfp_encode handler.
nb::tuple zfp_encode(Values x, int maxbits, int dims) {
  bool f64 = is_f64(x.dtype());
  check_maxbits(f64, maxbits, dims);
  uint64_t n = x.shape(0);
  if (n == 0) throw std::invalid_argument("zfp cannot encode an empty array");
  std::vector<uint64_t> words(jaxhc::zfp::payload_bytes(n, maxbits, dims) / 8);
  auto type = f64 ? jaxhc::zfp::Elem::kF64 : jaxhc::zfp::Elem::kF32;
  bool finite = jaxhc::zfp::encode_row(x.data(), type, n, maxbits, dims, words.data());
  return nb::make_tuple(nb::bytes(words.data(), words.size() * 8), finite);
}

// The n values of a stream written by zfp_encode (float64 when f64, else float32).
nb::object zfp_decode(nb::bytes stream, uint64_t n, bool f64, int maxbits, int dims) {
  check_maxbits(f64, maxbits, dims);
  size_t need = jaxhc::zfp::payload_bytes(n, maxbits, dims);
  if (n == 0 || stream.size() != need)
    throw std::invalid_argument("zfp stream of " + std::to_string(stream.size()) +
                                " bytes does not hold " + std::to_string(n) + " values (need " +
                                std::to_string(need) + ")");
  std::vector<uint64_t> words(need / 8);
  std::memcpy(words.data(), stream.c_str(), need);
  size_t size = n * (f64 ? 8 : 4);
  auto* out = new uint8_t[size];
  jaxhc::zfp::decode_row(words.data(), f64 ? jaxhc::zfp::Elem::kF64 : jaxhc::zfp::Elem::kF32, n,
                         maxbits, dims, out);
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  size_t shape[1] = {n};
  if (f64) return nb::cast(nb::ndarray<nb::numpy, double, nb::ndim<1>>(out, 1, shape, owner));
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, 1, shape, owner));
}
// The transform of the rotated block quantizers alone (cpu/quant_kernels.h hadamard_rows, on the
// kernel JAXHC_QUANT_KERNEL picks): H x per block of int32 values, n a multiple of block.
nb::object quant_hadamard(nb::ndarray<nb::numpy, nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu,
                                      int32_t> x,
                          uint64_t block) {
  if (!jaxhc::quant::valid_rotated_block(static_cast<int64_t>(block)))
    throw std::invalid_argument("quant_hadamard block " + std::to_string(block) +
                                " must be a power of two in 64..1024");
  uint64_t n = x.shape(0);
  if (n % block) throw std::invalid_argument("quant_hadamard: n must be a multiple of block");
  auto* out = new int32_t[n ? n : 1];
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
  jaxhc::quant::hadamard_rows(jaxhc::quant::active_kernel(), x.data(), n, block, out);
  size_t shape[1] = {n};
  return nb::cast(nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>(out, 1, shape, owner));
}

// The positive levels (integers of 2^-16) and the thresholds between them (float32) of the
// rotated quantizers (core/quant_levels.h).
nb::tuple quant_levels(int bits) {
  if (bits != 8 && bits != 4) throw std::invalid_argument("quant_levels bits must be 8 or 4");
  const int k = 1 << (bits - 1);
  const int32_t* lv = bits == 8 ? jaxhc::quant::kLevels8 : jaxhc::quant::kLevels4;
  const float* th = bits == 8 ? jaxhc::quant::kThresholds8 : jaxhc::quant::kThresholds4;
  nb::list levels, thresholds;
  for (int j = 0; j < k; j++) levels.append(lv[j]);
  for (int j = 0; j + 1 < k; j++) thresholds.append(th[j]);
  return nb::make_tuple(levels, thresholds);
}
}  // namespace

NB_MODULE(_jaxhc_cpu, m) {
  m.doc() = "jaxhc CPU codecs as XLA FFI handlers";
  m.def("registrations", []() {
    nb::dict d;
    d["jaxhc_zfp_encode"] = Capsule(JaxhcZfpEncodeCpu);
    d["jaxhc_zfp_decode"] = Capsule(JaxhcZfpDecodeCpu);
    d["jaxhc_zfp_decode_sum"] = Capsule(JaxhcZfpDecodeSumCpu);
    d["jaxhc_quant_encode"] = Capsule(JaxhcQuantEncodeCpu);
    d["jaxhc_quant_decode"] = Capsule(JaxhcQuantDecodeCpu);
    d["jaxhc_quant_decode_sum"] = Capsule(JaxhcQuantDecodeSumCpu);
    d["jaxhc_mpc_encode"] = Capsule(JaxhcMpcEncodeCpu);
    d["jaxhc_mpc_decode"] = Capsule(JaxhcMpcDecodeCpu);
    return d;
  });
  m.def(
      "threads",
      [] {
        const jaxhc::ThreadSetting& s = jaxhc::thread_setting();
        if (!s.error.empty()) throw std::invalid_argument(s.error);
        return s.threads;
      },
      "Threads each codec call may use: JAXHC_THREADS, else the CPUs of the process's affinity "
      "mask (read once, at the first call).");
  m.def("zfp_payload_bytes", &jaxhc::zfp::payload_bytes, nb::arg("n"), nb::arg("maxbits"),
        nb::arg("dims"),
        "Bytes of a fixed-rate ZFP stream of n values in blocks of 4^dims (64-bit words, as "
        "zfpy writes it).");
  m.def("zfp_encode", &zfp_encode, nb::arg("x"), nb::arg("maxbits"), nb::arg("dims"),
        "Encode a 1-D float32/float64 numpy array on the host in blocks of 4^dims values: "
        "(stream bytes, all finite).");
  m.def("zfp_decode", &zfp_decode, nb::arg("stream"), nb::arg("n"), nb::arg("f64"),
        nb::arg("maxbits"), nb::arg("dims"),
        "Decode n values of a host stream written by zfp_encode.");
  m.def(
      "zfp_kernels",
      []() {
        nb::list names;
        for (auto k : {jaxhc::zfp::Kernel::kAvx512, jaxhc::zfp::Kernel::kAvx2,
                       jaxhc::zfp::Kernel::kBmi2, jaxhc::zfp::Kernel::kPortable})
          if (jaxhc::zfp::kernel_supported(k)) names.append(jaxhc::zfp::kernel_name(k));
        return names;
      },
      "ZFP kernels this CPU runs, fastest first (JAXHC_ZFP_KERNEL picks one; default the first).");
  m.def(
      "quant_payload_bytes",
      [](uint64_t n, int bits, uint64_t block, bool rotate) {
        return jaxhc::quant::payload_bytes(n, bits, block, rotate);
      },
      nb::arg("n"), nb::arg("bits"), nb::arg("block"), nb::arg("rotate") = false,
      "Bytes of a q8/q4 payload of n values: float32 scales, codes (rotated: of whole blocks), "
      "zeros to a multiple of 8.");
  m.def("quant_hadamard", &quant_hadamard, nb::arg("x"), nb::arg("block"),
        "H x per block of int32 values by the transform of q8:h/q4:h (n a multiple of block).");
  m.def("quant_levels", &quant_levels, nb::arg("bits"),
        "(positive levels as integers of 2^-16, float32 thresholds between them) of the rotated "
        "quantizers q8:h/q4:h.");
  m.def(
      "quant_kernels",
      []() {
        nb::list names;
        for (auto k : {jaxhc::quant::Kernel::kAvx512, jaxhc::quant::Kernel::kAvx2,
                       jaxhc::quant::Kernel::kPortable})
          if (jaxhc::quant::kernel_supported(k)) names.append(jaxhc::quant::kernel_name(k));
        return names;
      },
      "q8/q4 kernels this CPU runs, fastest first (JAXHC_QUANT_KERNEL picks one).");
  m.def("mpc_header_bytes", &jaxhc::mpc::header_bytes, nb::arg("n"), nb::arg("word_bytes"),
        "Bytes of the MPC payload header (and chunk table) for n words of word_bytes each.");
  m.def("mpc_max_payload_bytes", &jaxhc::mpc::max_payload_bytes, nb::arg("n"),
        nb::arg("word_bytes"), "Worst-case MPC payload bytes for n words: never exceeded.");
  m.def(
      "mpc_status_message",
      [](int32_t s) { return jaxhc::mpc::status_message(s); }, nb::arg("status"),
      "What an MPC decode status (mpc::Status) means.");
  m.def("mpc_scratch_bytes", &jaxhc::mpc::scratch_bytes, nb::arg("n"), nb::arg("word_bytes"),
        "Bytes of the scratch result the MPC encoder takes per item of n words.");
}
