// Experiment: the wide-row RMSNorm / LayerNorm outside Triton, on Hopper's bulk copies
// (issue 2's 256K rows; NOTES.md, twenty-third session; loaded by bulk_norm.py).
//
// Why: the library's split-row picks reach 88% of copy at 256 x 256K because their SMs move
// 1.7-2.6x a copy's bytes between L2 and registers (the pass-2 re-read, the weight every row,
// each element through registers twice). Here a row is cut over a cluster of R CTAs; CTA k
// owns segment k (seg = N / R columns):
//   1. one thread issues cp.async.bulk of the segment of x into shared memory (CHUNKS
//      pieces on CHUNKS mbarriers, so that the sums start on the first piece), no
//      registers in the copy;
//   2. the warps sum from shared memory (RMSNorm: sum x^2; LayerNorm: the segment's mean,
//      then sum (x - mean_k)^2, exact two-pass), one block reduction, and each CTA writes
//      its (mean_k, m2_k) into every peer's shared memory (DSMEM); one cluster barrier;
//      the statistics combine as Chan's formula with equal counts:
//        mean = sum_k mean_k / R,  m2 = sum_k m2_k + seg * sum_k (mean_k - mean)^2;
//   3. y is computed from shared memory and written back over the segment, and one bulk
//      store sends it to global memory.
// The weight (and bias) come from shared memory, bulk-loaded once for all the CTA's rows
// (WSMEM), or from global memory through the L1 (16-byte loads). With NBUF = 2 a CTA walks
// rows cluster_id, cluster_id + clusters, ... with the next row's segment already loading
// (persistent: the grid is the clusters that fit); NBUF = 1 and one row a cluster is the
// plain form.
//
// Conventions as the library's: RMSNorm y = bf16(bf16(x * rstd) * w) (Llama);
// LayerNorm y = bf16((x - mean) * rstd * w + b); float32 statistics; bf16 in and out.
// Limits (checked by the launcher): seg a multiple of 8 * CHUNKS columns, rows 16-byte
// aligned, at most 16 CTAs a cluster.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 bulk_norm.cu

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cstdint>

namespace cg = cooperative_groups;
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

template <bool HINT>
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  if (HINT)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy) : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

template <bool HINT>
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes, uint64_t policy) {
  if (HINT)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;"
                 ::"l"(dst), "r"(smem_addr(src)), "r"(bytes), "l"(policy) : "memory");
  else
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

__device__ __forceinline__ void unpack8(const uint4& v, float f[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float f[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

template <int THREADS>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < THREADS / 32; ++i) t += scratch[i];
  __syncthreads();  // scratch free for the next reduction
  return t;
}

template <int THREADS, int VPT, int NBUF, int CHUNKS, bool RMS, bool WSMEM, bool HINT, bool COPY, int EARLY,
          int XCH, int PB>
__device__ __forceinline__ void bulk_norm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          const bf16* __restrict__ b, bf16* __restrict__ y, int rows, int seg,
                                          long long sx, long long sy, float eps) {
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned ranks = cluster.num_blocks(), rank = cluster.block_rank();
  const int cid = blockIdx.x / ranks, clusters = gridDim.x / ranks, tid = threadIdx.x;
  static_assert(VPT % CHUNKS == 0 && VPT % PB == 0, "whole vectors a thread a chunk, a batch");
  constexpr int vecs = THREADS * VPT, cvecs = vecs / CHUNKS;  // 16-byte vectors: segment, chunk
  // (seg == 8 * vecs: the launcher picks VPT so; the loops below unroll completely, so each
  // thread's VPT weight loads are in flight together rather than one L2 trip at a time)
  const uint32_t cbytes = 16u * cvecs;
  const float n = static_cast<float>(seg) * ranks;

  extern __shared__ __align__(128) unsigned char dsm[];
  bf16* ws = reinterpret_cast<bf16*>(dsm);                  // (seg,) weight when WSMEM
  bf16* bs = ws + (WSMEM ? seg : 0);                        // (seg,) bias when WSMEM and LayerNorm
  bf16* xs = bs + ((WSMEM && !RMS) ? seg : 0);              // (NBUF, seg) row segments
  __shared__ __align__(8) uint64_t full[NBUF][CHUNKS];      // one phase a row a chunk
  __shared__ __align__(8) uint64_t wbar;
  __shared__ float2 red[2][16];                             // peers' (mean_k, m2_k), two rows apart
  __shared__ __align__(8) uint64_t xbar[2];                 // XCH: red[i]'s bytes landed
  __shared__ float scratch[THREADS / 32];

  uint64_t pol_stream = 0, pol_keep = 0;
  if (HINT) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol_stream));
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol_keep));
  }
  if (tid == 0) {
    for (int s = 0; s < NBUF; ++s)
      for (int c = 0; c < CHUNKS; ++c) mbar_init(&full[s][c], 1);
    mbar_init(&wbar, 1);
    mbar_init(&xbar[0], 1);
    mbar_init(&xbar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster.sync();  // the barriers initialized, and every peer running before DSMEM writes

  auto issue_row = [&](int s, int row) {
    const bf16* src = x + row * sx + rank * seg;
    for (int c = 0; c < CHUNKS; ++c) {
      mbar_expect(&full[s][c], cbytes);
      bulk_load<HINT>(xs + s * seg + c * cvecs * 8, src + c * cvecs * 8, cbytes, &full[s][c], pol_stream);
    }
  };
  if (tid == 0) {
    if (WSMEM) {
      mbar_expect(&wbar, (RMS ? 2u : 4u) * seg);
      bulk_load<HINT>(ws, w + rank * seg, 2u * seg, &wbar, pol_keep);
      if (!RMS) bulk_load<HINT>(bs, b + rank * seg, 2u * seg, &wbar, pol_keep);
    }
    for (int s = 0; s < NBUF; ++s)
      if (cid + s * clusters < rows) issue_row(s, cid + s * clusters);
  }

  int pending = -1;  // the row whose load waits for its buffer's store to be read (thread 0)
  const uint4* wg = reinterpret_cast<const uint4*>(w + rank * seg);
  const uint4* bg = reinterpret_cast<const uint4*>(b + (RMS ? 0 : rank * seg));
  for (int it = 0, row = cid; row < rows; ++it, row += clusters) {
    const int s = it % NBUF;
    const uint32_t parity = (it / NBUF) & 1;
    uint4* xv = reinterpret_cast<uint4*>(xs + s * seg);
    uint4 wr[VPT], br[RMS ? 1 : VPT];  // this thread's weight (and bias) vectors
    if (EARLY == 1 && !WSMEM) {  // this row's weight (and bias) on its way while x's copy lands
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        wr[k] = __ldg(wg + tid + k * THREADS);
        if (!RMS) br[k] = __ldg(bg + tid + k * THREADS);
      }
    }
    if (EARLY == 2 && !WSMEM) {  // the same into the L1, no registers held: pass 2 hits there
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"(wg + tid + k * THREADS));
        if (!RMS) asm volatile("prefetch.global.L1 [%0];" ::"l"(bg + tid + k * THREADS));
      }
    }
    if (COPY) {  // the same bulk traffic with nothing between load and store: the ceiling
      for (int c = 0; c < CHUNKS; ++c) mbar_wait(&full[s][c], parity);
      if (tid == 0) {
        bulk_store<HINT>(y + row * sy + rank * seg, xv, 2u * seg, pol_stream);
        if (row + NBUF * clusters < rows) {
          asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
          issue_row(s, row + NBUF * clusters);
        }
      }
      continue;
    }

    // Pass 1 over shared memory: RMSNorm sum x^2; LayerNorm sum x, then sum (x - mean_k)^2.
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      mbar_wait(&full[s][c], parity);
#pragma unroll
      for (int k = 0; k < VPT / CHUNKS; ++k) {
        float f[8];
        unpack8(xv[c * cvecs + tid + k * THREADS], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += RMS ? f[i] * f[i] : f[i];
      }
    }
    float mean_k = 0.f, m2_k = block_sum<THREADS>(acc, scratch);
    if (!RMS) {
      mean_k = m2_k / seg;
      acc = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float f[8];
        unpack8(xv[tid + k * THREADS], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc += (f[i] - mean_k) * (f[i] - mean_k);
      }
      m2_k = block_sum<THREADS>(acc, scratch);
    }
    // The previous row's store has had pass 1 to read its buffer out: refill that buffer now,
    // not right after the store (which held warp 0, and with it every block reduction).
    if (tid == 0 && pending >= 0) {
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      issue_row((it + NBUF - 1) % NBUF, pending);
    }

    // The cluster's exchange: each CTA's statistics into every peer's red[it & 1]. XCH: by
    // st.async, whose bytes complete the receiver's mbarrier xbar[it & 1] (expecting 8 bytes
    // from each rank): no cluster barrier, whose release fence compiles to MEMBAR.ALL.GPU.
    // A peer cannot run two rows ahead (it needs this CTA's next row first), so two slots do.
    float2* slot = red[it & 1];
    if (XCH == 2) {  // diagnostic: no exchange, each segment normalized by its own statistics
      slot[rank] = make_float2(mean_k, m2_k);
    } else if (XCH == 1) {
      if (tid == 0) mbar_expect(&xbar[it & 1], 8u * ranks);
      if (tid < static_cast<int>(ranks)) {
        uint32_t to, bar;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(smem_addr(slot + rank)), "r"(tid));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(smem_addr(&xbar[it & 1])), "r"(tid));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                     ::"r"(to), "f"(mean_k), "f"(m2_k), "r"(bar) : "memory");
      }
      mbar_wait(&xbar[it & 1], (it >> 1) & 1);
    } else {
      if (tid < static_cast<int>(ranks)) cluster.map_shared_rank(slot, tid)[rank] = make_float2(mean_k, m2_k);
      cluster.sync();
    }
    float mean = 0.f, m2 = 0.f;
    const unsigned k0 = XCH == 2 ? rank : 0, k1 = XCH == 2 ? rank + 1 : ranks;
    if (!RMS) {
      for (unsigned k = k0; k < k1; ++k) mean += slot[k].x;
      mean /= k1 - k0;
    }
    for (unsigned k = k0; k < k1; ++k) {
      const float d = slot[k].x - mean;
      m2 += slot[k].y + (RMS ? 0.f : seg * d * d);
    }
    const float rstd = rsqrtf(m2 / (XCH == 2 ? static_cast<float>(seg) : n) + eps);

    // Pass 2: y over the segment in shared memory, then one bulk store.
    if (WSMEM && it == 0) mbar_wait(&wbar, 0);
    // In batches of PB vectors a thread: each batch's weight (and bias) loads issued together
    // before their first use (PB = VPT: one L2 trip; less: fewer registers, for LayerNorm).
#pragma unroll
    for (int k0 = 0; k0 < VPT; k0 += PB) {
      if (EARLY != 1 || WSMEM) {
#pragma unroll
        for (int k = k0; k < k0 + PB; ++k) {
          const int v = tid + k * THREADS;
          wr[k] = WSMEM ? reinterpret_cast<const uint4*>(ws)[v] : __ldg(wg + v);
          if (!RMS) br[k] = WSMEM ? reinterpret_cast<const uint4*>(bs)[v] : __ldg(bg + v);
        }
      }
#pragma unroll
      for (int k = k0; k < k0 + PB; ++k) {
        const int v = tid + k * THREADS;
        float f[8], g[8], h[8];
        unpack8(xv[v], f);
        unpack8(wr[k], g);
        if (RMS) {
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] = __bfloat162float(__float2bfloat16_rn(f[i] * rstd)) * g[i];
        } else {
          unpack8(br[k], h);
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] = (f[i] - mean) * rstd * g[i] + h[i];
        }
        xv[v] = pack8(f);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // y's stores seen by the bulk copy
    __syncthreads();
    if (tid == 0) {
      bulk_store<HINT>(y + row * sy + rank * seg, xv, 2u * seg, pol_stream);
      pending = row + NBUF * clusters < rows ? row + NBUF * clusters : -1;
      if (NBUF == 1 && pending >= 0) {  // nothing else to do before the refill
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        issue_row(s, pending);
        pending = -1;
      }
    }
  }
  // Shared memory must outlive the last store's read of it (as CUTLASS's epilogues wait);
  // the writes themselves complete before the grid does.
  if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// extern "C" entry points, one per variant:
// bulk_{rms|layer|copy}_t{THREADS}_v{VPT}_b{NBUF}_c{CHUNKS}_w{WSMEM}_h{HINT}_e{EARLY}_x{XCH}_p{PB}.
#define BULK_NORM(KIND, RMS, T, V, NB, CH, WS, HI, CP, EA, XC, PB)                                  \
  extern "C" __global__ void __launch_bounds__(T)                                                   \
      bulk_##KIND##_t##T##_v##V##_b##NB##_c##CH##_w##WS##_h##HI##_e##EA##_x##XC##_p##PB(            \
          const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int seg, long long sx,    \
          long long sy, float eps) {                                                                \
    bulk_norm<T, V, NB, CH, RMS, WS, HI, CP, EA, XC, PB>(x, w, b, y, rows, seg, sx, sy, eps);      \
  }

#define BOTH(T, V, NB, CH, WS, HI, EA, XC, PB)                  \
  BULK_NORM(rms, true, T, V, NB, CH, WS, HI, false, EA, XC, PB) \
  BULK_NORM(layer, false, T, V, NB, CH, WS, HI, false, EA, XC, PB)

// T  V  NB CH WS HI EA XC PB. EARLY: 0 the weight loaded in pass 2, 1 into registers at the
// row's start, 2 prefetched into the L1 there; XCH: 0 cluster barrier, 1 st.async, 2 none
// (diagnostic). 16K-column segments at 256 threads: 256K over 16 ranks, 128K over 8.
BOTH(256, 8, 1, 4, 0, 1, 0, 0, 8)
BOTH(256, 8, 1, 4, 0, 1, 0, 1, 8)
BOTH(256, 8, 1, 4, 0, 1, 1, 1, 8)
BOTH(256, 8, 1, 4, 0, 1, 2, 1, 8)
BOTH(256, 8, 1, 4, 0, 1, 2, 1, 4)
BOTH(256, 8, 1, 4, 0, 1, 2, 1, 2)
BOTH(256, 8, 1, 4, 0, 1, 1, 2, 8)
BOTH(256, 8, 2, 4, 0, 1, 1, 1, 8)
BOTH(256, 8, 2, 4, 0, 1, 2, 1, 4)
BOTH(256, 4, 1, 4, 0, 1, 1, 1, 4)
BOTH(256, 4, 1, 4, 0, 1, 2, 1, 4)
BOTH(256, 16, 1, 4, 0, 1, 1, 1, 16)
BOTH(256, 16, 1, 4, 0, 1, 2, 1, 4)
BOTH(512, 4, 1, 4, 0, 1, 1, 1, 4)
BOTH(256, 8, 1, 4, 1, 1, 0, 1, 8)
BULK_NORM(copy, true, 256, 8, 1, 4, 0, 1, true, 0, 0, 8)
BULK_NORM(copy, true, 256, 8, 2, 4, 0, 1, true, 0, 0, 8)
BULK_NORM(copy, true, 256, 16, 1, 4, 0, 1, true, 0, 0, 16)
