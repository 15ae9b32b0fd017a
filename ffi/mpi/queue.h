// Asynchronous fused collectives: a start hands a call to a progress thread and returns at once;
// a done waits for it. Between the two the engine owns copies of the call's buffers (XLA may reuse
// the input as soon as start returns, and the output exists only when done runs).
//
// One progress thread per communicator runs that communicator's calls in the order they were
// started, so every rank runs them in the same order, and a communicator's calls never wait behind
// another's (a tensor-axis call does not queue behind a data-axis reduction). Each thread has a
// workspace of its own. The communicators given here must be used by nothing else while calls are
// in flight (the MPI transport passes duplicates made for this): the engine's messages and its
// agreement (psum_scatter's MPI_Allreduce) then cannot interleave with the calling thread's.
//
// This needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default); without it, or with
// JAXHC_MPI_ASYNC=0, start runs the call itself, synchronously, and done only hands out its result.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "mpi/engine.h"

namespace jaxhc {
namespace mpi {

// Whether calls run on progress threads: MPI is initialised with MPI_THREAD_MULTIPLE and the
// environment variable JAXHC_MPI_ASYNC is not "0" (read at every call: tests switch it).
bool async_ready();

// One call of the engine: reads x, writes y, keeps its buffers in `workspace`; "" or an error.
using Work = std::function<std::string(const void* x, void* y, Workspace* workspace, Stats* stats)>;

// Copies in_bytes of x and queues `work` on comm's progress thread (or runs it now, see above);
// returns the call's ticket, a number in [1, 2^23] (exact as a float32).
int32_t start(MPI_Comm comm, const void* x, size_t in_bytes, size_t out_bytes, Work work);

// Waits for the call of `ticket`, copies its out_bytes of result into y and its traffic into
// stats; "" or why not (an unknown ticket, a size other than start's, the call's own error).
std::string done(int32_t ticket, void* y, size_t out_bytes, Stats* stats);

// How many started calls no done has taken yet (every rank's program finishes each call it
// starts: after a step this is 0).
size_t outstanding();

}  // namespace mpi
}  // namespace jaxhc
