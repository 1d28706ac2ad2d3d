// Experiment: bulk_norm.cu's row made persistent and warp-specialized (issue 2's 256K rows;
// NOTES.md, twenty-third session; loaded by bulk_norm.py). Outcome: rms_norm 256 x 256K
// 86.6-88.5% of copy (five buffers, LOOK) against the Triton pick's 88%, with this pipeline's
// own copy (CP) at 91%; 64 x 256K 79-80% against 76-77%; layer_norm under the pick. Not taken.
//
// Why: in bulk_norm.cu a CTA's slot holds no bytes in flight while it sums, waits for its
// peers and normalizes; its persistent form (two buffers) refilled a buffer only half a row
// ahead, since the thread that stores also computes. Here one producer warp (warp CW) owns
// the copies: for each of the CTA's rows it waits until the consumers have written y into
// the buffer's previous row (mbarrier ydone), stores that row, waits for the store to read the
// buffer out, and loads the next row into it, while CW consumer warps work on the other
// buffers. NBUF buffers of the segment (seg = N / R columns, 2 * seg bytes each) and, with
// WSMEM, the weight (and bias) held in shared memory for all the CTA's rows, so the weight
// crosses L2 -> SM once a CTA instead of once a row. The grid is the clusters that fit.
// LOOK 1: the consumers sum row i + 1 and send its statistics before they wait for row i's
// from their peers, so the exchange's round trip across the cluster overlaps a pass 1
// (a peer can then run up to three sends ahead of this CTA's reads: four slots).
// XW 1: each consumer warp sends its own statistics to the peers (R x CW partials a row)
// and combines them itself: no CTA barrier on a row's path, so the warps drift apart and
// overlap one another's phases (with one CTA an SM, a barrier-stepped CTA waits out each
// phase's latency). Statistics, exchange and row math as bulk_norm.cu (bulk_ptx.cuh).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 bulk_norm_ws.cu

#include "bulk_ptx.cuh"

template <int CW, int VPT, int NBUF, bool RMS, bool WSMEM, int EARLY, int PB, int LOOK, int XW, int PROD,
          int CP, bool HT>
__device__ __forceinline__ void ws_norm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                        const bf16* __restrict__ b, bf16* __restrict__ y, int rows, int seg,
                                        long long sx, long long sy, float eps) {
  constexpr int CT = 32 * CW;  // consumer threads; the producer is warp CW
  static_assert(VPT % PB == 0 && NBUF % PROD == 0, "whole batches; a producer's rows keep to its buffers");
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned ranks = cluster.num_blocks(), rank = cluster.block_rank();
  const int cid = blockIdx.x / ranks, clusters = gridDim.x / ranks, tid = threadIdx.x;
  const uint32_t bytes = 2u * seg;

  extern __shared__ __align__(128) unsigned char dsm[];
  bf16* ws = reinterpret_cast<bf16*>(dsm);                  // (seg,) weight when WSMEM
  bf16* bs = ws + (WSMEM ? seg : 0);                        // (seg,) bias when WSMEM and LayerNorm
  bf16* xs = bs + ((WSMEM && !RMS) ? seg : 0);              // (NBUF, seg) row segments
  __shared__ __align__(8) uint64_t full[NBUF];              // x of the buffer's row landed
  __shared__ __align__(8) uint64_t ydone[NBUF];             // y of the buffer's row written (CT arrivals)
  constexpr int SLOTS = LOOK ? 4 : 2;                       // exchange slots (see LOOK)
  __shared__ __align__(8) uint64_t wbar, xbar[SLOTS];
  __shared__ float2 red[SLOTS][XW ? 16 * CW : 16];
  __shared__ float scratch[CW];

  if (tid == 0) {
    for (int s = 0; s < NBUF; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&ydone[s], CT);
    }
    mbar_init(&wbar, 1);
    for (int i = 0; i < SLOTS; ++i) mbar_init(&xbar[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster.sync();  // the barriers initialized, and every peer running before DSMEM writes

  if (tid >= CT) {  // the producer warps: lane 0 of each issues the copies of its rows
    const int p = (tid - CT) >> 5;
    if (tid & 31) return;
    uint64_t pol_stream, pol_keep;
    l2_policies(pol_stream, pol_keep);
    if (WSMEM && p == 0) {
      mbar_expect(&wbar, (RMS ? 1u : 2u) * bytes);
      bulk_load<true>(ws, w + rank * seg, bytes, &wbar, pol_keep);
      if (!RMS) bulk_load<true>(bs, b + rank * seg, bytes, &wbar, pol_keep);
    }
    auto store = [&](int j) {  // the CTA's j-th row, once its y is written
      const int s = j % NBUF;
      mbar_wait(&ydone[s], (j / NBUF) & 1);
      bulk_store<HT>(y + (cid + static_cast<long long>(j) * clusters) * sy + rank * seg, xs + s * seg, bytes,
                       pol_stream);
    };
    // The CTA's rows j = p, p + P, ... (P = 1, or NBUF: one producer a buffer, so that one
    // buffer's wait for its store to be read out holds up no other buffer's load).
    const int n = cid < rows ? (rows - cid + clusters - 1) / clusters : 0;
    for (int it = p; it < n; it += PROD) {
      const int s = it % NBUF;
      if (it >= NBUF) {  // the buffer's previous row out first
        store(it - NBUF);
        bulk_wait_read();
      }
      mbar_expect(&full[s], bytes);
      bulk_load<HT>(xs + s * seg, x + (cid + static_cast<long long>(it) * clusters) * sx + rank * seg, bytes,
                      &full[s], pol_stream);
    }
    for (int j = n > NBUF ? n - NBUF : 0; j < n; ++j)
      if (j % PROD == p) store(j);
    bulk_wait_read();  // shared memory read out
    return;
  }

  const uint4* wg = reinterpret_cast<const uint4*>(w + rank * seg);
  const uint4* bg = reinterpret_cast<const uint4*>(b + (RMS ? 0 : rank * seg));
  // Pass 1 of the CTA's row j (its x in buffer j % NBUF) and the send of its statistics.
  auto stats = [&](int j) {
    const uint4* xv = reinterpret_cast<const uint4*>(xs + (j % NBUF) * seg);
    mbar_wait(&full[j % NBUF], (j / NBUF) & 1);
    if (XW) {
      send_warp_stats<CW>(red[j % SLOTS], &xbar[j % SLOTS], warp_stats<RMS, CT, VPT>(xv, tid), tid, rank, ranks);
    } else {
      const float first = sum_vecs<RMS ? 1 : 0, CT, VPT>(xv, tid, 0.f);
      send_stats(red[j % SLOTS], &xbar[j % SLOTS], seg_stats<RMS, 1, CT, VPT>(xv, tid, seg, first, scratch), tid,
                 rank, ranks);
    }
  };
  if (LOOK && !CP && cid < rows) stats(0);
  for (int it = 0, row = cid; row < rows; ++it, row += clusters) {
    const int s = it % NBUF;
    uint4* xv = reinterpret_cast<uint4*>(xs + s * seg);
    if (CP) {  // diagnostic: y = x, the consumers only hand each buffer back (the pipeline's ceiling)
      mbar_wait(&full[s], (it / NBUF) & 1);
      mbar_arrive(&ydone[s]);
      continue;
    }
    uint4 wr[VPT], br[RMS ? 1 : VPT];
    if (EARLY == 1 && !WSMEM) load_wb<RMS, false, CT, VPT>(wr, br, ws, bs, wg, bg, tid, 0);
    if (EARLY == 2 && !WSMEM) prefetch_wb<RMS, CT, VPT>(wg, bg, tid);
    if (!LOOK) stats(it);
    else if (row + clusters < rows) stats(it + 1);
    mbar_wait(&xbar[it % SLOTS], (it / SLOTS) & 1);
    const float2 mr = XW ? combine_warps<RMS>(red[it % SLOTS], ranks * CW, 256.f * VPT, eps, tid & 31)
                         : combine<RMS>(red[it % SLOTS], 0, ranks, seg, eps);
    pass2<RMS, WSMEM, EARLY, CT, VPT, PB>(xv, wr, br, ws, bs, wg, bg, tid, mr, &wbar, it == 0);
    mbar_arrive(&ydone[s]);
  }
}

// extern "C" entry points:
// ws_{rms|layer|copy}_w{CW}_v{VPT}_b{NBUF}_s{WSMEM}_e{EARLY}_p{PB}_l{LOOK}_x{XW}_q{PROD}{SUF};
// CW + PROD warps. HT: the L2 hints on x and y; without them (session 24) the name ends _h0.
#define WS_ENTRY(KIND, RMS, CW, V, NB, WS, EA, PB, LK, XW, PR, CP, HT, SUF)                         \
  extern "C" __global__ void __launch_bounds__(32 * (CW + PR))                                      \
      ws_##KIND##_w##CW##_v##V##_b##NB##_s##WS##_e##EA##_p##PB##_l##LK##_x##XW##_q##PR##SUF(        \
          const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int seg, long long sx,    \
          long long sy, float eps) {                                                                \
    ws_norm<CW, V, NB, RMS, WS, EA, PB, LK, XW, PR, CP, HT>(x, w, b, y, rows, seg, sx, sy, eps);    \
  }
#define WS_NORM(KIND, RMS, CW, V, NB, WS, EA, PB, LK, XW, PR, CP) \
  WS_ENTRY(KIND, RMS, CW, V, NB, WS, EA, PB, LK, XW, PR, CP, true, )
#define WS_NORM_H0(KIND, RMS, CW, V, NB, WS, EA, PB, LK, XW, PR, CP) \
  WS_ENTRY(KIND, RMS, CW, V, NB, WS, EA, PB, LK, XW, PR, CP, false, _h0)

#define WS_BOTH(CW, V, NB, WS, EA, PB, LK, XW, PR)              \
  WS_NORM(rms, true, CW, V, NB, WS, EA, PB, LK, XW, PR, 0)    \
  WS_NORM(layer, false, CW, V, NB, WS, EA, PB, LK, XW, PR, 0)

// CW V NB WS EA PB LK XW PR: 16K-column segments with 8 consumer warps (256K over 16 ranks,
// 128K over 8); the weight held (WS 1) with 3-5 buffers, or read early into registers; the
// exchange a CTA or a warp at a time; one producer, or one a buffer; 16 consumer warps.
WS_BOTH(8, 8, 4, 1, 0, 8, 0, 0, 1)
WS_BOTH(8, 8, 5, 1, 0, 8, 1, 0, 1)
WS_BOTH(8, 8, 4, 1, 0, 8, 0, 1, 1)
WS_BOTH(8, 8, 5, 1, 0, 8, 1, 1, 1)
WS_BOTH(8, 8, 3, 1, 0, 8, 1, 1, 1)
WS_BOTH(8, 8, 3, 0, 1, 8, 1, 1, 1)
WS_BOTH(8, 8, 3, 1, 0, 8, 1, 1, 3)
WS_BOTH(8, 8, 4, 1, 0, 8, 1, 1, 4)
WS_BOTH(8, 8, 5, 1, 0, 8, 1, 1, 5)
WS_BOTH(16, 4, 4, 1, 0, 4, 1, 1, 4)
WS_NORM(copy, true, 8, 8, 5, 0, 0, 8, 0, 0, 1, 1)
WS_NORM(copy, true, 8, 8, 5, 0, 0, 8, 0, 0, 5, 1)
WS_NORM(copy, true, 8, 8, 3, 0, 0, 8, 0, 0, 3, 1)
// Without the hints: the best forms (rms_norm 5 buffers, layer_norm 4 with one producer a
// buffer) and their copies.
WS_NORM_H0(rms, true, 8, 8, 5, 1, 0, 8, 1, 1, 1, 0)
WS_NORM_H0(rms, true, 8, 8, 5, 1, 0, 8, 1, 1, 5, 0)
WS_NORM_H0(rms, true, 8, 8, 4, 1, 0, 8, 1, 1, 4, 0)
WS_NORM_H0(layer, false, 8, 8, 4, 1, 0, 8, 1, 1, 4, 0)
WS_NORM_H0(copy, true, 8, 8, 5, 0, 0, 8, 0, 0, 1, 1)
WS_NORM_H0(copy, true, 8, 8, 5, 0, 0, 8, 0, 0, 5, 1)
