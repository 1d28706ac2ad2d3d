// Experiment: the wide-row RMSNorm / LayerNorm outside Triton, on Hopper's bulk copies
// (issue 2's 256K rows; NOTES.md, twenty-third session; loaded by bulk_norm.py). Outcome:
// 84.5-85.8% of copy at rms_norm 256 x 256K against the Triton pick's 88% (a copy through
// the same bulk loads and stores: 93%); not taken.
//
// Why: the library's split-row picks reach 88% of copy at 256 x 256K while their SMs move
// 1.7-2.6x a copy's bytes between L2 and registers (the pass-2 re-read, the weight every row,
// each element through registers twice). Here a row is cut over a cluster of R CTAs; CTA k
// owns segment k (seg = N / R columns, VPT 16-byte vectors a thread):
//   1. one thread issues cp.async.bulk of the segment of x into shared memory (CHUNKS
//      pieces on CHUNKS mbarriers, so that the sums start on the first piece), no
//      registers in the copy;
//   2. the warps sum from shared memory (RMSNorm: sum x^2; LayerNorm: the segment's mean,
//      then sum (x - mean_k)^2, exact two-pass), one block reduction, and each CTA sends
//      its (mean_k, m2_k) to every peer's shared memory: by st.async on the peer's mbarrier
//      (XCH 1) or by DSMEM stores and a cluster barrier (XCH 0); the statistics combine as
//      Chan's formula with equal counts:
//        mean = sum_k mean_k / R,  m2 = sum_k m2_k + seg * sum_k (mean_k - mean)^2;
//   3. y is computed from shared memory and written back over the segment (PB vectors a
//      batch), and one bulk store sends it to global memory.
// The weight (and bias) come from shared memory, bulk-loaded once for all the CTA's rows
// (WSMEM), or from global memory: in pass 2 (EARLY 0), into registers at the row's start
// (1), or prefetched into the L1 then (2). With NBUF > 1 a CTA walks rows cluster_id,
// cluster_id + clusters, ... with the next rows' segments already loading (persistent: the
// grid is the clusters that fit); NBUF = 1 and one row a cluster is the plain form. COPY and
// XCH 2 are diagnostics (y = x; no exchange).
//
// Conventions as the library's: RMSNorm y = bf16(bf16(x * rstd) * w) (Llama);
// LayerNorm y = bf16((x - mean) * rstd * w + b); float32 statistics; bf16 in and out.
// Limits (checked by the launcher): seg = 8 * THREADS * VPT columns with VPT a multiple of
// CHUNKS and PB, rows 16-byte aligned, at most 16 CTAs a cluster.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 bulk_norm.cu

#include "bulk_ptx.cuh"

template <int THREADS, int VPT, int NBUF, int CHUNKS, bool RMS, bool WSMEM, bool HINT, bool COPY, int EARLY,
          int XCH, int PB>
__device__ __forceinline__ void bulk_norm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          const bf16* __restrict__ b, bf16* __restrict__ y, int rows, int seg,
                                          long long sx, long long sy, float eps) {
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned ranks = cluster.num_blocks(), rank = cluster.block_rank();
  const int cid = blockIdx.x / ranks, clusters = gridDim.x / ranks, tid = threadIdx.x;
  static_assert(VPT % CHUNKS == 0 && VPT % PB == 0, "whole vectors a thread a chunk, a batch");
  // 16-byte vectors: the segment's (seg == 8 * vecs: the launcher picks VPT so) and a chunk's.
  // The loops unroll completely, so a thread's VPT weight loads are in flight together.
  constexpr int vecs = THREADS * VPT, cvecs = vecs / CHUNKS;
  const uint32_t cbytes = 16u * cvecs;

  extern __shared__ __align__(128) unsigned char dsm[];
  bf16* ws = reinterpret_cast<bf16*>(dsm);                  // (seg,) weight when WSMEM
  bf16* bs = ws + (WSMEM ? seg : 0);                        // (seg,) bias when WSMEM and LayerNorm
  bf16* xs = bs + ((WSMEM && !RMS) ? seg : 0);              // (NBUF, seg) row segments
  __shared__ __align__(8) uint64_t full[NBUF][CHUNKS];      // one phase a row a chunk
  __shared__ __align__(8) uint64_t wbar;
  __shared__ float2 red[2][16];                             // peers' (mean_k, m2_k), two rows apart
  __shared__ __align__(8) uint64_t xbar[2];                 // XCH 1: red[i]'s bytes landed
  __shared__ float scratch[THREADS / 32];

  uint64_t pol_stream = 0, pol_keep = 0;
  if (HINT) l2_policies(pol_stream, pol_keep);
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
    // EARLY 1: this row's weight (and bias) on its way while x's copy lands; 2: the same into
    // the L1, no registers held, pass 2 hits there.
    if (EARLY == 1 && !WSMEM) load_wb<RMS, false, THREADS, VPT>(wr, br, ws, bs, wg, bg, tid, 0);
    if (EARLY == 2 && !WSMEM) prefetch_wb<RMS, THREADS, VPT>(wg, bg, tid);
    if (COPY) {  // the same bulk traffic with nothing between load and store: the ceiling
      for (int c = 0; c < CHUNKS; ++c) mbar_wait(&full[s][c], parity);
      if (tid == 0) {
        bulk_store<HINT>(y + row * sy + rank * seg, xv, 2u * seg, pol_stream);
        if (row + NBUF * clusters < rows) {
          bulk_wait_read();
          issue_row(s, row + NBUF * clusters);
        }
      }
      continue;
    }

    // Pass 1 over shared memory, a chunk as it lands.
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      mbar_wait(&full[s][c], parity);
      acc = sum_vecs<RMS ? 1 : 0, THREADS, VPT / CHUNKS>(xv + c * cvecs, tid, acc);
    }
    const float2 mine = seg_stats<RMS, 0, THREADS, VPT>(xv, tid, seg, acc, scratch);
    // The previous row's store has had pass 1 to read its buffer out: refill that buffer now,
    // not right after the store (which held warp 0, and with it every block reduction).
    if (tid == 0 && pending >= 0) {
      bulk_wait_read();
      issue_row((it + NBUF - 1) % NBUF, pending);
    }

    // The cluster's exchange into every peer's red[it & 1] (a peer cannot run two rows ahead:
    // it needs this CTA's next row first, so two slots do). XCH 0: a cluster barrier; 1:
    // st.async on mbarriers; 2 (diagnostic): none, each segment by its own statistics.
    float2* slot = red[it & 1];
    if (XCH == 2) {
      slot[rank] = mine;
    } else if (XCH == 1) {
      exchange(slot, &xbar[it & 1], (it >> 1) & 1, mine, tid, rank, ranks);
    } else {
      if (tid < static_cast<int>(ranks)) cluster.map_shared_rank(slot, tid)[rank] = mine;
      cluster.sync();
    }
    const float2 mr = XCH == 2 ? combine<RMS>(slot, rank, rank + 1, seg, eps) : combine<RMS>(slot, 0, ranks, seg, eps);

    // Pass 2: y over the segment in shared memory, then one bulk store.
    pass2<RMS, WSMEM, EARLY, THREADS, VPT, PB>(xv, wr, br, ws, bs, wg, bg, tid, mr, &wbar, it == 0);
    __syncthreads();
    if (tid == 0) {
      bulk_store<HINT>(y + row * sy + rank * seg, xv, 2u * seg, pol_stream);
      pending = row + NBUF * clusters < rows ? row + NBUF * clusters : -1;
      if (NBUF == 1 && pending >= 0) {  // nothing else to do before the refill
        bulk_wait_read();
        issue_row(s, pending);
        pending = -1;
      }
    }
  }
  // Shared memory must outlive the last store's read of it (as CUTLASS's epilogues wait);
  // the writes themselves complete before the grid does.
  if (tid == 0) bulk_wait_read();
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
