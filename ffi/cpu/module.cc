// Python module _jaxhc_cpu: the CPU FFI handlers and the payload-size formulas of each codec's format.
#include <nanobind/nanobind.h>

#include "core/mpc.h"
#include "core/zfp.h"
#include "cpu/handlers.h"

namespace nb = nanobind;

namespace {
template <typename T>
nb::capsule Capsule(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_jaxhc_cpu, m) {
  m.doc() = "jaxhc CPU codecs as XLA FFI handlers";
  m.def("registrations", []() {
    nb::dict d;
    d["jaxhc_zfp_encode"] = Capsule(JaxhcZfpEncodeCpu);
    d["jaxhc_zfp_decode"] = Capsule(JaxhcZfpDecodeCpu);
    d["jaxhc_mpc_encode"] = Capsule(JaxhcMpcEncodeCpu);
    d["jaxhc_mpc_decode"] = Capsule(JaxhcMpcDecodeCpu);
    return d;
  });
  m.def("zfp_payload_bytes", &jaxhc::zfp::payload_bytes, nb::arg("n"), nb::arg("maxbits"),
        "Bytes of a fixed-rate 1-D ZFP stream of n values (64-bit words, as zfpy writes it).");
  m.def("mpc_header_bytes", &jaxhc::mpc::header_bytes, nb::arg("n"), nb::arg("word_bytes"),
        "Bytes of the MPC payload header (and chunk table) for n words of word_bytes each.");
  m.def("mpc_max_payload_bytes", &jaxhc::mpc::max_payload_bytes, nb::arg("n"),
        nb::arg("word_bytes"), "Worst-case MPC payload bytes for n words: never exceeded.");
  m.def("mpc_scratch_bytes", &jaxhc::mpc::scratch_bytes, nb::arg("n"), nb::arg("word_bytes"),
        "Bytes of the scratch result the MPC encoder takes per item of n words.");
}
