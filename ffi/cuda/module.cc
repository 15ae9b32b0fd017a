// Python module _jaxhc_cuda: the CUDA FFI handlers (registered for platform "CUDA").
#include <nanobind/nanobind.h>

#include "cuda/handlers.h"

namespace nb = nanobind;

namespace {
template <typename T>
nb::capsule Capsule(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}
}  // namespace

NB_MODULE(_jaxhc_cuda, m) {
  m.doc() = "jaxhc CUDA codecs as XLA FFI handlers";
  m.def("registrations", []() {
    nb::dict d;
    d["jaxhc_zfp_encode"] = Capsule(JaxhcZfpEncodeCuda);
    d["jaxhc_zfp_decode"] = Capsule(JaxhcZfpDecodeCuda);
    d["jaxhc_zfp_decode_sum"] = Capsule(JaxhcZfpDecodeSumCuda);
    d["jaxhc_quant_encode"] = Capsule(JaxhcQuantEncodeCuda);
    d["jaxhc_quant_decode"] = Capsule(JaxhcQuantDecodeCuda);
    d["jaxhc_quant_decode_sum"] = Capsule(JaxhcQuantDecodeSumCuda);
    d["jaxhc_mpc_encode"] = Capsule(JaxhcMpcEncodeCuda);
    d["jaxhc_mpc_decode"] = Capsule(JaxhcMpcDecodeCuda);
    return d;
  });
}
