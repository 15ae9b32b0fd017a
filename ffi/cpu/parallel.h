// Splits a range of independent work items over the host's cores for one FFI call.
// Handlers run concurrently (one per simulated device), so nothing here is global or shared.
#pragma once
#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace jaxhc {

inline unsigned host_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? n : 1;
}

// Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` items (except the
// last), on up to host_threads() threads; the calling thread takes the first range. Blocks until done.
template <typename Fn>
void parallel_for(size_t n, size_t grain, Fn&& fn) {
  grain = std::max<size_t>(grain, 1);
  size_t parts = std::min<size_t>(host_threads(), (n + grain - 1) / grain);
  if (parts <= 1) {
    if (n) fn(size_t{0}, n);
    return;
  }
  size_t step = (n + parts - 1) / parts;
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  for (size_t p = 1; p < parts; ++p) {
    size_t b = p * step, e = std::min(n, b + step);
    if (b < e) workers.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(size_t{0}, std::min(n, step));
  for (auto& w : workers) w.join();
}

}  // namespace jaxhc
