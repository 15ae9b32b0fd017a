// The progress threads of the asynchronous fused collectives (see queue.h).
#include "mpi/queue.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cpu/fp_mode.h"

namespace jaxhc {
namespace mpi {
namespace {

constexpr int32_t kMaxTicket = 1 << 23;  // tickets travel as float32 values
constexpr size_t kKeptBlocks = 16;       // free blocks a queue keeps for later calls

// An engine-owned buffer. Fresh ones are not touched here: the call writes (or the copy fills)
// every byte it reads.
struct Block {
  std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
  size_t cap = 0;
};

Block allocate(size_t bytes) {
  Block b;
  b.cap = std::max<size_t>(64, (bytes + 4095) / 4096 * 4096);
  b.p.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, b.cap)));
  if (!b.p) throw std::bad_alloc();
  return b;
}

class Queue;

struct Job {
  Work work;
  Block in, out;
  size_t out_bytes = 0;
  FpMode mode;  // the starting thread's (XLA:CPU's: denormals flushed), for the sums
  Queue* queue = nullptr;
  std::string error;
  Stats stats;
  bool finished = false;
  std::mutex mu;
  std::condition_variable cv;

  void run(Workspace* workspace) {
    std::string err;
    mode.run([&] {
      try {
        err = work(in.p.get(), out.p.get(), workspace, &stats);
      } catch (const std::exception& e) {
        err = e.what();
      }
    });
    work = nullptr;  // its codec goes now, not when done runs
    std::lock_guard<std::mutex> lock(mu);
    error = err;
    finished = true;
    cv.notify_all();
  }
};

// One communicator's calls, in start order, on a thread of its own.
class Queue {
 public:
  Queue() : workspace_(new_workspace()), thread_([this] { loop(); }) { thread_.detach(); }

  void push(std::shared_ptr<Job> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }

  Block take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < free_.size(); ++i)
        if (free_[i].cap >= bytes) {
          Block b = std::move(free_[i]);
          free_.erase(free_.begin() + i);
          return b;
        }
    }
    return allocate(bytes);
  }

  void give(Block b) {
    if (!b.p) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < kKeptBlocks) free_.push_back(std::move(b));
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job->run(workspace_);
    }
  }

  Workspace* workspace_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  std::vector<Block> free_;
  std::thread thread_;
};

// Every queue and every call between its start and its done. Never destroyed: the detached
// progress threads may still wait on their queues when the process exits.
struct Registry {
  std::mutex mu;
  std::map<MPI_Comm, std::unique_ptr<Queue>> queues;
  std::unordered_map<int32_t, std::shared_ptr<Job>> calls;
  int32_t last = 0;

  Queue* queue(MPI_Comm comm) {
    auto& q = queues[comm];
    if (!q) q = std::make_unique<Queue>();
    return q.get();
  }
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

bool async_ready() {
  const char* env = std::getenv("JAXHC_MPI_ASYNC");
  if (env && std::strcmp(env, "0") == 0) return false;
  int init = 0, fin = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return false;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

int32_t start(MPI_Comm comm, const void* x, size_t in_bytes, size_t out_bytes, Work work) {
  auto job = std::make_shared<Job>();
  const bool async = async_ready();
  Registry& r = registry();
  int32_t ticket;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    job->queue = async ? r.queue(comm) : nullptr;
    do ticket = r.last = r.last % kMaxTicket + 1;
    while (r.calls.count(ticket));
    r.calls[ticket] = job;
  }
  job->work = std::move(work);
  job->out_bytes = out_bytes;
  job->in = job->queue ? job->queue->take(in_bytes) : allocate(in_bytes);
  job->out = job->queue ? job->queue->take(out_bytes) : allocate(out_bytes);
  if (in_bytes) std::memcpy(job->in.p.get(), x, in_bytes);
  if (job->queue)
    job->queue->push(job);
  else
    job->run(nullptr);  // synchronous: the shared workspace
  return ticket;
}

size_t outstanding() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.calls.size();
}

std::string done(int32_t ticket, void* y, size_t out_bytes, Stats* stats) {
  Registry& r = registry();
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.calls.find(ticket);
    if (it == r.calls.end()) return "no call was started with ticket " + std::to_string(ticket);
    job = std::move(it->second);
    r.calls.erase(it);
  }
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->finished; });
  }
  std::string err = job->error;
  if (err.empty() && out_bytes != job->out_bytes)
    err = "the result has " + std::to_string(job->out_bytes) + " bytes, not " +
          std::to_string(out_bytes);
  if (err.empty()) {
    if (out_bytes) std::memcpy(y, job->out.p.get(), out_bytes);
    *stats = job->stats;
  }
  if (job->queue) {
    job->queue->give(std::move(job->in));
    job->queue->give(std::move(job->out));
  }
  return err;
}

}  // namespace mpi
}  // namespace jaxhc
