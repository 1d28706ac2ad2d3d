// What the bulk-copy norm kernels share (bulk_norm.cu, bulk_norm_ws.cu; issue 2, NOTES.md,
// twenty-third session): PTX for mbarriers and bulk copies, bf16 vectors, the block sums, the
// segment statistics, the cluster exchange by st.async (a CTA or a warp at a time), and
// pass 2's row math.
#pragma once

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

// Whether phase ``parity`` of bar has completed, without waiting.
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done;
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// L2 policies: evict-first for the streamed rows (x, y), evict-last for the weight.
__device__ __forceinline__ void l2_policies(uint64_t& stream, uint64_t& keep) {
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(stream));
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
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

// This thread's bulk stores have read their shared memory (it may be refilled or freed).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
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

// Named barrier BAR over NT threads (BAR 0 with all of the CTA's threads is __syncthreads).
template <int BAR, int NT>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(BAR), "n"(NT) : "memory");
}

// The sum of v over the NT threads that share barrier BAR (threads 0..NT-1).
template <int BAR, int NT>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  bar_sync<BAR, NT>();
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < NT / 32; ++i) t += scratch[i];
  bar_sync<BAR, NT>();  // scratch free for the next reduction
  return t;
}

// acc plus the sum over K vectors a thread, xv[tid + k * NT] (shared memory), of x (MODE 0),
// x^2 (1) or (x - m)^2 (2).
template <int MODE, int NT, int K>
__device__ __forceinline__ float sum_vecs(const uint4* xv, int tid, float acc, float m = 0.f) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float f[8];
    unpack8(xv[tid + k * NT], f);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += MODE == 0 ? f[i] : MODE == 1 ? f[i] * f[i] : (f[i] - m) * (f[i] - m);
  }
  return acc;
}

// (mean_k, m2_k) of this CTA's segment from its K vectors a thread: RMSNorm (0, sum x^2);
// LayerNorm exact two-pass over shared memory (mean_k, sum (x - mean_k)^2).
template <bool RMS, int BAR, int NT, int K>
__device__ __forceinline__ float2 seg_stats(const uint4* xv, int tid, int seg, float first, float* scratch) {
  const float s1 = block_sum<BAR, NT>(first, scratch);
  if (RMS) return make_float2(0.f, s1);
  const float mean_k = s1 / seg;
  return make_float2(mean_k, block_sum<BAR, NT>(sum_vecs<2, NT, K>(xv, tid, 0.f, mean_k), scratch));
}

// v into the float2 at ``slot`` (this CTA's address of it) in the shared memory of cluster rank
// ``peer``, completing ``peer``'s mbarrier ``xbar`` by its 8 bytes.
__device__ __forceinline__ void st_async_peer(float2* slot, uint64_t* xbar, float2 v, unsigned peer) {
  uint32_t to, bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(smem_addr(slot)), "r"(peer));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(bar) : "r"(smem_addr(xbar)), "r"(peer));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               ::"r"(to), "f"(v.x), "f"(v.y), "r"(bar) : "memory");
}

// Each CTA's (mean_k, m2_k) into red[rank] of every peer by st.async, whose bytes complete the
// receiver's mbarrier xbar (expecting 8 bytes from each rank; this CTA's thread 0 arms its
// own): no cluster barrier, whose release fence compiles to MEMBAR.ALL.GPU. The receiver then
// waits for phase ``parity`` of its xbar (``exchange`` does both).
__device__ __forceinline__ void send_stats(float2* red, uint64_t* xbar, float2 mine, int tid, unsigned rank,
                                           unsigned ranks) {
  if (tid == 0) mbar_expect(xbar, 8u * ranks);
  if (tid < static_cast<int>(ranks)) st_async_peer(red + rank, xbar, mine, tid);
}

__device__ __forceinline__ void exchange(float2* red, uint64_t* xbar, uint32_t parity, float2 mine, int tid,
                                         unsigned rank, unsigned ranks) {
  send_stats(red, xbar, mine, tid, rank, ranks);
  mbar_wait(xbar, parity);
}

// The row's (mean, rstd) from the peers' red[k0..k1): Chan's formula with equal counts,
//   mean = sum_k mean_k / R,  m2 = sum_k m2_k + seg * sum_k (mean_k - mean)^2,  n = seg * R.
template <bool RMS>
__device__ __forceinline__ float2 combine(const float2* red, unsigned k0, unsigned k1, int seg, float eps) {
  float mean = 0.f, m2 = 0.f;
  if (!RMS) {
    for (unsigned k = k0; k < k1; ++k) mean += red[k].x;
    mean /= k1 - k0;
  }
  for (unsigned k = k0; k < k1; ++k) {
    const float d = red[k].x - mean;
    m2 += red[k].y + (RMS ? 0.f : seg * d * d);
  }
  return make_float2(mean, rsqrtf(m2 / (static_cast<float>(seg) * (k1 - k0)) + eps));
}

// --- The exchange a warp at a time (bulk_norm_ws.cu's XW): no CTA barrier on the row's path.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// (mean_w, m2_w) of this warp's K vectors a lane, xv[tid + k * NT]: RMSNorm (0, sum x^2);
// LayerNorm two-pass over shared memory (the warp's mean, then sum (x - mean_w)^2).
template <bool RMS, int NT, int K>
__device__ __forceinline__ float2 warp_stats(const uint4* xv, int tid) {
  const float s1 = warp_sum(sum_vecs<RMS ? 1 : 0, NT, K>(xv, tid, 0.f));
  if (RMS) return make_float2(0.f, s1);
  const float mean_w = s1 / (256 * K);  // 32 lanes x K vectors x 8
  return make_float2(mean_w, warp_sum(sum_vecs<2, NT, K>(xv, tid, 0.f, mean_w)));
}

// This warp's statistics into red[rank * W + warp] of every peer (W warps a CTA send), by
// st.async on the peer's xbar; thread 0 of the CTA arms its own xbar for all R * W entries.
template <int W>
__device__ __forceinline__ void send_warp_stats(float2* red, uint64_t* xbar, float2 mine, int tid, unsigned rank,
                                                unsigned ranks) {
  const int lane = tid & 31, warp = tid >> 5;
  if (tid == 0) mbar_expect(xbar, 8u * ranks * W);
  if (lane < static_cast<int>(ranks)) st_async_peer(red + rank * W + warp, xbar, mine, lane);
}

// The row's (mean, rstd) from the E = R * W equal-count partials in red (cnt elements each),
// by the warp's lanes together (Chan's formula as ``combine``).
template <bool RMS>
__device__ __forceinline__ float2 combine_warps(const float2* red, int e, float cnt, float eps, int lane) {
  float sx = 0.f, sy = 0.f;
  for (int i = lane; i < e; i += 32) {
    sx += red[i].x;
    sy += red[i].y;
  }
  float mean = 0.f, m2 = warp_sum(sy);
  if (!RMS) {
    mean = warp_sum(sx) / e;
    float d2 = 0.f;
    for (int i = lane; i < e; i += 32) d2 += (red[i].x - mean) * (red[i].x - mean);
    m2 += cnt * warp_sum(d2);
  }
  return make_float2(mean, rsqrtf(m2 / (cnt * e) + eps));
}

// y of one 16-byte vector from (mean, rstd) = mr: RMSNorm y = bf16(bf16(x * rstd) * w)
// (Llama); LayerNorm y = bf16((x - mean) * rstd * w + b) (``*bv`` not read for RMSNorm).
template <bool RMS>
__device__ __forceinline__ uint4 norm_vec(const uint4& xv, const uint4& wv, const uint4* bv, float2 mr) {
  float f[8], g[8], h[8];
  unpack8(xv, f);
  unpack8(wv, g);
  if (RMS) {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = __bfloat162float(__float2bfloat16_rn(f[i] * mr.y)) * g[i];
  } else {
    unpack8(*bv, h);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = (f[i] - mr.x) * mr.y * g[i] + h[i];
  }
  return pack8(f);
}

// Pass 2 over the thread's vectors k0..k0+PB-1, in place in shared memory (``norm_vec``).
template <bool RMS, int NT, int PB>
__device__ __forceinline__ void normalize(uint4* xv, const uint4* wr, const uint4* br, int tid, float2 mr,
                                          int k0) {
#pragma unroll
  for (int k = k0; k < k0 + PB; ++k) {
    const int v = tid + k * NT;
    xv[v] = norm_vec<RMS>(xv[v], wr[k], br + k, mr);
  }
}

// This thread's weight (and bias) vectors k0..k0+PB-1 into registers, from shared memory (ws,
// bs) or global (wg, bg).
// (k0 is a constant once the caller's loop over batches unrolls: the arrays stay in registers.)
template <bool RMS, bool WSMEM, int NT, int PB>
__device__ __forceinline__ void load_wb(uint4* wr, uint4* br, const bf16* ws, const bf16* bs, const uint4* wg,
                                        const uint4* bg, int tid, int k0) {
#pragma unroll
  for (int k = k0; k < k0 + PB; ++k) {
    const int v = tid + k * NT;
    wr[k] = WSMEM ? reinterpret_cast<const uint4*>(ws)[v] : __ldg(wg + v);
    if (!RMS) br[k] = WSMEM ? reinterpret_cast<const uint4*>(bs)[v] : __ldg(bg + v);
  }
  // All issued before any of pass 2's stores to shared memory: without this the compiler
  // interleaves them (one L2 trip after another, as the SASS of the first version showed).
  asm volatile("" ::: "memory");
}

// Pass 2 of a row over the thread's VPT vectors in shared memory, PB a batch (each batch's
// weight and bias loaded first, unless EARLY 1 loaded them all at the row's start), then the
// fence that lets the bulk store see y. The weight's bulk copy (WSMEM) is awaited on the
// CTA's first row.
template <bool RMS, bool WSMEM, int EARLY, int NT, int VPT, int PB>
__device__ __forceinline__ void pass2(uint4* xv, uint4* wr, uint4* br, const bf16* ws, const bf16* bs,
                                      const uint4* wg, const uint4* bg, int tid, float2 mr, uint64_t* wbar,
                                      bool first) {
  if (WSMEM && first) mbar_wait(wbar, 0);
#pragma unroll
  for (int k0 = 0; k0 < VPT; k0 += PB) {
    if (EARLY != 1 || WSMEM) load_wb<RMS, WSMEM, NT, PB>(wr, br, ws, bs, wg, bg, tid, k0);
    normalize<RMS, NT, PB>(xv, wr, br, tid, mr, k0);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // y's stores seen by the bulk copy
}

// The weight (and bias) vectors of this thread prefetched into the L1 (no registers held).
template <bool RMS, int NT, int K>
__device__ __forceinline__ void prefetch_wb(const uint4* wg, const uint4* bg, int tid) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(wg + tid + k * NT));
    if (!RMS) asm volatile("prefetch.global.L1 [%0];" ::"l"(bg + tid + k * NT));
  }
}
