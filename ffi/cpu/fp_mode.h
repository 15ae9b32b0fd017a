// The floating-point mode of a calling thread, carried into the pool threads that work for it.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>
#else
#include <cfenv>
#endif

namespace jaxhc {

// The floating-point mode (MXCSR: flush-to-zero, denormals-are-zero, rounding) of the thread that
// called, applied in the threads that do the work for it, so decode_sum adds as it would.
class FpMode {
 public:
#if defined(__x86_64__)
  FpMode() : csr_(_mm_getcsr()) {}
  template <typename Fn>
  void run(Fn&& fn) const {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(csr_);
    fn();
    _mm_setcsr(saved);
  }

 private:
  unsigned csr_;
#else
  FpMode() { fegetenv(&env_); }
  template <typename Fn>
  void run(Fn&& fn) const {
    fenv_t saved;
    fegetenv(&saved);
    fesetenv(&env_);
    fn();
    fesetenv(&saved);
  }

 private:
  fenv_t env_;
#endif
};

}  // namespace jaxhc
