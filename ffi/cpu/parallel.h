// The codec threads of the CPU module: one persistent pool shared by every handler.
//
// host_threads() is the number of threads a call may use: JAXHC_THREADS when set (it may exceed
// the cores, which is how a 2-core CI runs the 3..8-thread code paths), else the CPUs in the
// process's affinity mask (sched_getaffinity: taskset, cgroup cpusets and MPI bindings count, unlike
// std::thread::hardware_concurrency). Both are read once, at the first call (the Python module
// calls threads() at import, from the main thread).
//
// parallel_for splits [0, n) into ranges; the calling thread runs ranges of its own job until none
// is left while idle pool workers take the others, then it waits only for ranges already running.
// FFI handlers run concurrently (one per simulated device, up to 8 at once): each caller can
// finish its job alone, so several callers never deadlock, and a busy pool degrades to callers
// running their own ranges (nested calls from inside a range work the same way).
#pragma once
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

namespace jaxhc {

constexpr unsigned kMaxThreads = 1024;

struct ThreadSetting {
  unsigned threads;
  std::string error;  // why JAXHC_THREADS was not used, or ""
};

inline unsigned affinity_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return unsigned(CPU_COUNT(&set));
  unsigned n = std::thread::hardware_concurrency();
  return n ? n : 1;
}

inline ThreadSetting read_thread_setting() {
  ThreadSetting s{affinity_cpus(), ""};
  const char* env = std::getenv("JAXHC_THREADS");
  if (!env || !*env) return s;
  char* end = nullptr;
  unsigned long v = std::strtoul(env, &end, 10);
  if (*env < '0' || *env > '9' || *end || v < 1 || v > kMaxThreads) {
    s.error = "JAXHC_THREADS=" + std::string(env) + " is not a whole number in 1.." +
              std::to_string(kMaxThreads);
    return s;
  }
  s.threads = unsigned(v);
  return s;
}

inline const ThreadSetting& thread_setting() {
  static const ThreadSetting s = read_thread_setting();
  return s;
}

inline unsigned host_threads() { return thread_setting().threads; }

namespace detail {

using RangeFn = void (*)(void* ctx, size_t begin, size_t end);

struct Job {
  RangeFn fn;
  void* ctx;
  size_t n, step, ranges;
  std::atomic<size_t> next{0};     // the next range to claim
  std::atomic<size_t> pending{0};  // ranges not finished yet
  void run(size_t r) const { fn(ctx, r * step, std::min(n, (r + 1) * step)); }
};

class Pool {
 public:
  explicit Pool(unsigned workers) {
    for (unsigned i = 0; i < workers; ++i) std::thread([this] { work(); }).detach();
    // A forked child has none of the workers (and maybe a held lock): it runs callers alone.
    pthread_atfork(nullptr, nullptr, [] { forked_child().store(true); });
  }

  static std::atomic<bool>& forked_child() {
    static std::atomic<bool> flag{false};
    return flag;
  }

  // Runs every range of `job`; returns when all are done.
  void run(Job& job) {
    job.pending.store(job.ranges);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(&job);
    }
    if (job.ranges > 2) wake_.notify_all();
    else wake_.notify_one();
    for (size_t r; (r = job.next.fetch_add(1)) < job.ranges;) {
      job.run(r);
      job.pending.fetch_sub(1);
    }
    std::unique_lock<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), &job);
    if (it != queue_.end()) queue_.erase(it);
    done_.wait(lock, [&] { return job.pending.load() == 0; });
  }

 private:
  // A worker touches a job only while holding mu_ (a queued job is alive: its caller dequeues it
  // before returning) or while running a range it claimed (its caller waits for that range).
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return !queue_.empty(); });
      Job* job = queue_.front();
      size_t r = job->next.fetch_add(1);
      if (r + 1 >= job->ranges) queue_.pop_front();
      if (r >= job->ranges) continue;
      lock.unlock();
      job->run(r);
      lock.lock();
      if (job->pending.fetch_sub(1) == 1) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;  // workers: a job was queued
  std::condition_variable done_;  // callers: a range finished
  std::deque<Job*> queue_;        // jobs that may have ranges left, oldest first
};

// The pool (host_threads() - 1 workers; the caller is the last thread), made at first use and
// never destroyed: its workers sleep until the process ends.
inline Pool& pool() {
  static Pool* p = new Pool(host_threads() - 1);
  return *p;
}

}  // namespace detail

// Calls fn(begin, end) on disjoint ranges covering [0, n), each at least `grain` items (except the
// last), on up to host_threads() threads (the caller's among them). Blocks until all are done.
// fn must not throw.
template <typename Fn>
void parallel_for(size_t n, size_t grain, Fn&& fn) {
  grain = std::max<size_t>(grain, 1);
  size_t ranges = std::min<size_t>(host_threads(), (n + grain - 1) / grain);
  if (ranges <= 1 || detail::Pool::forked_child().load()) {
    if (n) fn(size_t{0}, n);
    return;
  }
  using F = std::remove_reference_t<Fn>;
  detail::Job job;
  job.fn = [](void* ctx, size_t b, size_t e) { (*static_cast<F*>(ctx))(b, e); };
  job.ctx = const_cast<void*>(static_cast<const void*>(&fn));
  job.step = (n + ranges - 1) / ranges;
  job.n = n;
  job.ranges = (n + job.step - 1) / job.step;
  detail::pool().run(job);
}

}  // namespace jaxhc
