// CUDA XLA FFI handlers of the MPC codec (contract in cpu/handlers.h): one warp per chunk, running
// the chunk pipeline of core/mpc_chunk.h with the warp's 32 lanes as the team (WarpTeam: lane l
// holds tiles l * kSlots.. in registers; what the lanes share goes through shuffles and the warp's
// shared memory). Everything runs on the XLA stream; nothing is allocated and nothing waits for
// the device.
//
// Encode, four kernels: each warp writes its chunk's stream into the scratch result at the chunk's
// worst-case offset and its size into the payload's table; one block per row scans the sizes into
// end offsets and writes the header and nbytes; warps copy the streams to their places (cut at
// the capacity); the tail past `used` is zeroed.
// Decode: every warp checks the header and its own table entry before reading its stream, so no
// read leaves the payload whatever the other entries say. Errors cannot be raised without a host
// sync, so a bad row is reported in `status` (the same code as the CPU decoder: the header's, else
// that of the lowest bad chunk) and its output is all zeros; `strict` is ignored here.
#include <cub/block/block_scan.cuh>
#include <string>

#include "core/ffi_args.h"
#include "core/mpc.h"
#include "core/mpc_chunk.h"
#include "cuda/handlers.h"

namespace ffi = xla::ffi;

namespace jaxhc {
namespace mpc {
namespace {

constexpr int kWarps = 4;                 // chunks per block
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int32_t kNoError = 0x7FFFFFFF;  // status while decoding: above every error key

template <typename V>
__device__ __forceinline__ V ShflUp(V v, int d) {
  if constexpr (sizeof(V) < 4) return V(__shfl_up_sync(kFull, unsigned(v), d));
  else return __shfl_up_sync(kFull, v, d);
}
template <typename V>
__device__ __forceinline__ V Shfl(V v, int lane) {
  if constexpr (sizeof(V) < 4) return V(__shfl_sync(kFull, unsigned(v), lane));
  else return __shfl_sync(kFull, v, lane);
}

// The 32 lanes of a warp as the team of the chunk pipeline.
template <typename U>
struct WarpTeam {
  static constexpr int W = Tiles<U>::W, T = Tiles<U>::T, kSlots = (T + 31) / 32;
  // The warp's shared words: the chunk with a spare word after every tile (so that lanes reading
  // their tiles' words hit different banks), also the byte stage of the pipeline.
  static constexpr int kShWords = kChunkWords + T;
  using Rows = U[W][kSlots];
  int lane;
  U* sh;

  static __device__ __forceinline__ int Sh(int i) { return i + i / W; }
  __device__ int first_tile() const { return lane * kSlots; }
  __device__ uint32_t member() const { return uint32_t(lane); }
  __device__ uint32_t members() const { return 32; }
  __device__ bool leader() const { return lane == 0; }
  __device__ void sync() const { __syncwarp(); }
  __device__ uint32_t sum(uint32_t v) const { return __reduce_add_sync(kFull, v); }
  __device__ uint32_t bit_or(uint32_t v) const { return __reduce_or_sync(kFull, v); }
  template <typename V>
  __device__ V scan(V (&v)[kSlots]) const {
    V local = 0;
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      V t = v[q];
      v[q] = local;
      local = V(local + t);
    }
    V incl = local;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      V u = ShflUp(incl, d);
      if (lane >= d) incl = V(incl + u);
    }
    const V before = V(incl - local);
#pragma unroll
    for (int q = 0; q < kSlots; ++q) v[q] = V(v[q] + before);
    return Shfl(incl, 31);
  }
  __device__ void shift(U (&v)[kSlots]) const {
    const U prev = ShflUp(v[kSlots - 1], 1);
#pragma unroll
    for (int q = kSlots - 1; q > 0; --q) v[q] = v[q - 1];
    v[0] = lane ? prev : U(0);
  }
  __device__ void copy(U* dst, const U* src, uint32_t words) const {
    for (uint32_t i = lane; i < words; i += 32) dst[i] = src[i];
  }
  template <typename In>
  __device__ void delta_rows(In in, uint32_t m, uint32_t dim, Rows& a) const {
    mpc::delta_rows<U, kSlots>(first_tile(), in, m, dim, a);
  }
  __device__ void transpose(Rows& a) const { transpose_bits<U, kSlots>(&a[0][0]); }
  __device__ void pack(const ChunkRows<U, kSlots>& r, U* packed) const {
    pack_rows<U, kSlots, false>(r, packed);
  }
  __device__ void unpack(const U* stored, ChunkRows<U, kSlots>& r) const {
    unpack_rows<U, kSlots>(stored, r);
  }
  // The rows into shared memory in word order (the caller synchronized the warp).
  __device__ void rows_to_shared(const Rows& a) const {
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      const int tile = first_tile() + q;
      if (tile < T)
#pragma unroll
        for (int k = 0; k < W; ++k) sh[Sh(tile * W + k)] = a[k][q];
    }
    __syncwarp();
  }
  __device__ void store_rows(const Rows& a, U* x, uint32_t m) const {
    rows_to_shared(a);
    for (uint32_t i = lane; i < m; i += 32) x[i] = sh[Sh(int(i))];
  }
  // x[i] = d[i] + x[i - dim], 32 words at a time: a scan over each residue class mod dim inside
  // the group, plus the class's last word of the groups before (already final in shared memory).
  __device__ void undelta(const Rows& a, uint32_t m, uint32_t dim, U* x) const {
    rows_to_shared(a);
    for (int r = 0; r < 32; ++r) {
      const int i = 32 * r + lane, i0 = 32 * r + lane % int(dim);
      U v = sh[Sh(i)];
      for (int d = int(dim); d < 32; d *= 2) {
        U u = ShflUp(v, d);
        if (lane >= d) v = U(v + u);
      }
      if (i0 >= int(dim)) v = U(v + sh[Sh(i0 - int(dim))]);
      __syncwarp();
      sh[Sh(i)] = v;
      __syncwarp();
    }
    for (uint32_t i = lane; i < m; i += 32) x[i] = sh[Sh(int(i))];
  }
};

// The encoder's input: the chunk as staged in shared memory. (A lambda here crashes nvcc 13.0.)
template <typename U>
struct SharedChunk {
  const U* sh;
  __device__ U operator()(uint32_t i) const { return sh[WarpTeam<U>::Sh(int(i))]; }
};

template <typename U>
__global__ void EncodeChunks(const U* x, uint64_t rows, uint64_t n, uint32_t dim, uint8_t* payload,
                             uint64_t capacity, uint8_t* scratch, uint64_t sbytes) {
  using Team = WarpTeam<U>;
  constexpr uint32_t wb = sizeof(U);
  __shared__ alignas(16) U shared[kWarps][Team::kShWords];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t nch = chunk_count(n), item = uint64_t(blockIdx.x) * kWarps + warp;
  if (item >= rows * nch) return;
  const uint64_t row = item / nch, c = item % nch;
  const uint32_t m = chunk_words(n, c);
  const U* xc = x + row * n + c * kChunkWords;
  uint8_t* dst = scratch + row * sbytes + c * kChunkWords * wb;
  const Team team{lane, shared[warp]};
  U* sh = shared[warp];
  for (uint32_t i = lane; i < m; i += 32) sh[Team::Sh(int(i))] = xc[i];
  __syncwarp();
  ChunkRows<U, Team::kSlots> r;
  uint8_t* stage = reinterpret_cast<uint8_t*>(sh);
  const uint32_t size =
      encode_chunk<U>(team, SharedChunk<U>{sh}, m, dim, r, stage);
  if (lane == 0) store<uint32_t>(payload + row * capacity + kFixedHeader + 4 * c, size);
  if (size == m * wb) {
    for (uint32_t i = lane; i < m; i += 32) store<U>(dst + i * wb, xc[i]);
  } else {
    for (uint32_t i = 4 * lane; i < size; i += 128) store<uint32_t>(dst + i, load<uint32_t>(stage + i));
  }
}

constexpr int kScanThreads = 256;

// One block per row: chunk sizes in the table -> end offsets; header, table padding, nbytes.
__global__ void ScanSizes(uint64_t n, uint32_t wb, uint32_t dim, uint8_t* payload,
                          uint64_t capacity, int32_t* nbytes) {
  using Scan = cub::BlockScan<uint32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ uint32_t carry;
  uint8_t* p = payload + blockIdx.x * capacity;
  const uint64_t nch = chunk_count(n), head = header_bytes(n, wb);
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (uint64_t base = 0; base < nch; base += kScanThreads) {
    uint64_t c = base + threadIdx.x;
    uint32_t v = c < nch ? load<uint32_t>(p + kFixedHeader + 4 * c) : 0, end, total;
    Scan(tmp).InclusiveSum(v, end, total);
    if (c < nch) store<uint32_t>(p + kFixedHeader + 4 * c, carry + end);
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    for (uint64_t i = kFixedHeader + 4 * nch; i < head; ++i) p[i] = 0;
    write_header(p, uint32_t(n), wb, dim, uint32_t(head + carry));
    nbytes[blockIdx.x] = int32_t(head + carry);
  }
}

// Warp per chunk: scratch stream -> its place in the payload, cut at the capacity.
__global__ void PlaceStreams(uint64_t rows, uint64_t n, uint32_t wb, uint8_t* payload,
                             uint64_t capacity, const uint8_t* scratch, uint64_t sbytes) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t nch = chunk_count(n), item = uint64_t(blockIdx.x) * kWarps + warp;
  if (item >= rows * nch) return;
  const uint64_t row = item / nch, c = item % nch;
  uint8_t* p = payload + row * capacity;
  const uint64_t head = header_bytes(n, wb), room = capacity - head;
  const uint64_t start = c ? load<uint32_t>(p + kFixedHeader + 4 * (c - 1)) : 0;
  if (start >= room) return;
  const uint64_t end = load<uint32_t>(p + kFixedHeader + 4 * c);
  const uint64_t len = end - start < room - start ? end - start : room - start;  // even
  const uint8_t* src = scratch + row * sbytes + c * kChunkWords * wb;
  uint8_t* dst = p + head + start;  // 4-aligned: streams are 4-aligned, room a multiple of 8
  for (uint64_t i = 4 * lane; i + 4 <= len; i += 128)
    store<uint32_t>(dst + i, load<uint32_t>(src + i));
  if (len % 4 && lane == 0) store<uint16_t>(dst + len - 2, load<uint16_t>(src + len - 2));
}

constexpr int kTailBytes = 4096;  // per block of ZeroTail / WipeRows

__global__ void ZeroTail(uint8_t* payload, uint64_t capacity, const int32_t* nbytes,
                         uint64_t blocks_per_row) {
  const uint64_t row = blockIdx.x / blocks_per_row, seg = blockIdx.x % blocks_per_row;
  const uint64_t used = uint64_t(nbytes[row]);
  uint8_t* p = payload + row * capacity;
  for (uint64_t i = seg * kTailBytes + threadIdx.x; i < (seg + 1) * kTailBytes && i < capacity;
       i += blockDim.x)
    if (i >= used) p[i] = 0;
}

__device__ void Fail(int32_t* status, int64_t chunk, Status s) {
  atomicMin(status, int32_t((chunk + 1) * 16 + s));
}

template <typename U>
__global__ void DecodeChunks(const uint8_t* payload, uint64_t rows, uint64_t capacity, uint64_t n,
                             uint32_t dim, U* x, int32_t* status) {
  using Team = WarpTeam<U>;
  constexpr uint32_t wb = sizeof(U);
  __shared__ alignas(16) U shared[kWarps][Team::kShWords];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t nch = chunk_count(n), item = uint64_t(blockIdx.x) * kWarps + warp;
  if (item >= rows * nch) return;
  const uint64_t row = item / nch, c = item % nch;
  const uint32_t m = chunk_words(n, c);
  const uint8_t* p = payload + row * capacity;
  U* xc = x + row * n + c * kChunkWords;
  int32_t* st = status + row;

  uint32_t begin, size;
  Status s = check_header(p, capacity, uint32_t(n), wb, dim);
  if (s) return lane == 0 ? Fail(st, -1, s) : void();
  if ((s = locate_chunk(p, uint32_t(n), wb, c, &begin, &size)))
    return lane == 0 ? Fail(st, c, s) : void();
  const uint8_t* src = p + header_bytes(n, wb) + begin;
  if (size == m * wb) {
    for (uint32_t i = lane; i < m; i += 32) xc[i] = load<U>(src + i * wb);
    return;
  }
  ChunkRows<U, Team::kSlots> r;
  s = decode_chunk<U>(Team{lane, shared[warp]}, src, size, m, dim, r, shared[warp], xc);
  if (s && lane == 0) Fail(st, c, s);
}

// Zeroes the output of every row with an error.
__global__ void WipeRows(uint8_t* x, uint64_t row_bytes, const int32_t* status,
                         uint64_t blocks_per_row) {
  const uint64_t row = blockIdx.x / blocks_per_row, seg = blockIdx.x % blocks_per_row;
  if (status[row] == kNoError) return;
  uint8_t* p = x + row * row_bytes;
  for (uint64_t i = seg * kTailBytes + threadIdx.x; i < (seg + 1) * kTailBytes && i < row_bytes;
       i += blockDim.x)
    p[i] = 0;
}

__global__ void SetNoError(int32_t* status, uint64_t rows) {
  uint64_t r = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows) status[r] = kNoError;
}

__global__ void FinishStatus(int32_t* status, uint64_t rows) {
  uint64_t r = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows) status[r] = status[r] == kNoError ? 0 : status[r] % 16;
}

// ---- handlers ----

ffi::Error Invalid(const std::string& what) { return ffi::Error::InvalidArgument("mpc " + what); }

ffi::Error Launched(const char* op) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("mpc ") + op + ": " + cudaGetErrorString(e));
}

uint64_t Blocks(uint64_t items, uint64_t per) { return (items + per - 1) / per; }

template <typename U>
void LaunchEncode(cudaStream_t s, const void* x, uint64_t rows, uint64_t n, uint32_t dim,
                  uint8_t* payload, uint64_t cap, int32_t* nbytes, uint8_t* scratch) {
  const uint64_t items = rows * chunk_count(n), sbytes = scratch_bytes(n, sizeof(U));
  const uint64_t tail_blocks = Blocks(cap, kTailBytes);
  EncodeChunks<U><<<Blocks(items, kWarps), 32 * kWarps, 0, s>>>(
      static_cast<const U*>(x), rows, n, dim, payload, cap, scratch, sbytes);
  ScanSizes<<<rows, kScanThreads, 0, s>>>(n, sizeof(U), dim, payload, cap, nbytes);
  PlaceStreams<<<Blocks(items, kWarps), 32 * kWarps, 0, s>>>(rows, n, sizeof(U), payload, cap,
                                                             scratch, sbytes);
  ZeroTail<<<rows * tail_blocks, 256, 0, s>>>(payload, cap, nbytes, tail_blocks);
}

ffi::Error Encode(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> payload,
                  ffi::Result<ffi::Buffer<ffi::S32>> nbytes,
                  ffi::Result<ffi::Buffer<ffi::U8>> scratch, int64_t dim) {
  Batch b;
  std::string why =
      check_encode_args(x, *payload, nbytes->dimensions(), scratch->dimensions(), dim, &b);
  if (!why.empty()) return Invalid("encode: " + why);
  const uint64_t rows = b.rows, n = b.n, cap = b.capacity;
  const uint32_t wb = b.wb;
  if (rows == 0) return ffi::Error::Success();
  uint8_t* p = static_cast<uint8_t*>(payload->untyped_data());
  int32_t* nb = nbytes->typed_data();
  uint8_t* s = scratch->typed_data();
  const uint32_t d = uint32_t(dim);
  switch (wb) {
    case 2: LaunchEncode<uint16_t>(stream, x.untyped_data(), rows, n, d, p, cap, nb, s); break;
    case 4: LaunchEncode<uint32_t>(stream, x.untyped_data(), rows, n, d, p, cap, nb, s); break;
    default: LaunchEncode<uint64_t>(stream, x.untyped_data(), rows, n, d, p, cap, nb, s); break;
  }
  return Launched("encode");
}

template <typename U>
void LaunchDecode(cudaStream_t s, const uint8_t* payload, uint64_t rows, uint64_t cap, uint64_t n,
                  uint32_t dim, void* x, int32_t* status) {
  const uint64_t items = rows * chunk_count(n), wipe_blocks = Blocks(n * sizeof(U), kTailBytes);
  SetNoError<<<Blocks(rows, 256), 256, 0, s>>>(status, rows);
  DecodeChunks<U><<<Blocks(items, kWarps), 32 * kWarps, 0, s>>>(payload, rows, cap, n, dim,
                                                               static_cast<U*>(x), status);
  WipeRows<<<rows * wipe_blocks, 256, 0, s>>>(static_cast<uint8_t*>(x), n * sizeof(U), status,
                                             wipe_blocks);
  FinishStatus<<<Blocks(rows, 256), 256, 0, s>>>(status, rows);
}

ffi::Error Decode(cudaStream_t stream, ffi::AnyBuffer payload, ffi::Result<ffi::AnyBuffer> x,
                  ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t dim, int64_t /*strict*/) {
  Batch b;
  std::string why = check_decode_args(payload, *x, status->dimensions(), dim, &b);
  if (!why.empty()) return Invalid("decode: " + why);
  const uint64_t rows = b.rows, n = b.n, cap = b.capacity;
  const uint32_t wb = b.wb;
  if (rows == 0) return ffi::Error::Success();
  const uint8_t* p = static_cast<const uint8_t*>(payload.untyped_data());
  int32_t* st = status->typed_data();
  const uint32_t d = uint32_t(dim);
  switch (wb) {
    case 2: LaunchDecode<uint16_t>(stream, p, rows, cap, n, d, x->untyped_data(), st); break;
    case 4: LaunchDecode<uint32_t>(stream, p, rows, cap, n, d, x->untyped_data(), st); break;
    default: LaunchDecode<uint64_t>(stream, p, rows, cap, n, d, x->untyped_data(), st); break;
  }
  return Launched("decode");
}

}  // namespace
}  // namespace mpc
}  // namespace jaxhc

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpcEncodeCuda, jaxhc::mpc::Encode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::U8>>()
                                  .Attr<int64_t>("dim"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxhcMpcDecodeCuda, jaxhc::mpc::Decode,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("dim")
                                  .Attr<int64_t>("strict"));
