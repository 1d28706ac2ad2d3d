// Experiment: the wide-row norms with every SM on every row (issue 2's 256K rows; NOTES.md,
// twenty-fourth session; loaded by grid_norm.py). Outcome: rms_norm 256 x 256K 47-54% of
// copy against the Triton pick's 88% (its own copy 89-91%, its own statistics without the
// exchange 67-80%), layer_norm 12%: the per-row hand-offs of a 4 KB slice and 132 CTAs
// polling the same lines of partials set the pace. Not taken.
//
// Why: the cluster and program forms give a row to a group of CTAs and move the group from
// row to row, so the group holds each row until its statistics are known and the last rounds
// run part-empty. Here CTA c (one an SM) owns the columns [c * S, c * S + nc) of every row:
// its weight (and bias) slice crosses L2 -> SM once a kernel, and a row's statistics are the
// sum of G partials, one from each CTA, exchanged through L2.
// Warp roles (CW compute warps, then the exchange warp, then the producer warp):
// - producer (one lane): row j's slice into stage j % D of a shared-memory ring by one bulk
//   copy, once the compute warps have written the stage's previous row (mbarrier empty);
// - compute warps: row i's partial (one warp's sums into shared memory, mbarrier reduced),
//   then row i - L's y from the stage (y = x * rstd * w with plain 16-byte stores from
//   registers) once its statistics are in (mbarrier ready), then the stage handed back;
// - exchange warp, never blocking: publishes each reduced row's CTA partial to global memory
//   as 64-bit words (launch tag << 32 | fp32 bits: single-copy atomic, so no fence), and polls
//   the G words of the oldest rows it has itself published, P rows a round trip, handing
//   (mean, rstd) to the compute warps. The tag is the epoch word ctl[0] + 1, read at the start;
//   the last CTA to finish advances ctl[0], so a graph replay never takes an earlier launch's
//   partials. The grid must be resident at once (the loader checks one CTA an SM fits).
// MODE 0: the norm; 1: the same pipeline with y = x (its ceiling); 2: each CTA's own
// statistics (a wrong y: what the global exchange costs).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 grid_norm.cu

#include "bulk_ptx.cuh"

__device__ __forceinline__ void st_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <bool H>
__device__ __forceinline__ void st_stream(void* p, uint4 v, uint64_t policy) {
  if (!H) {
    *reinterpret_cast<uint4*>(p) = v;
    return;
  }
  asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w), "l"(policy)
               : "memory");
}

__device__ __forceinline__ uint64_t tagged(unsigned tag, float v) {
  return (static_cast<uint64_t>(tag) << 32) | __float_as_uint(v);
}

// Chan's combine of (n_a, mean_a, m2_a) with (n_b, mean_b, m2_b) into a.
__device__ __forceinline__ void chan(float& n, float& mean, float& m2, float nb, float mb, float m2b) {
  const float t = n + nb;
  if (t == 0.f) return;
  const float d = mb - mean;
  mean += d * nb / t;
  m2 += m2b + d * d * n * nb / t;
  n = t;
}

// (n, mean, m2) over the warp's lanes by a butterfly: every lane ends with the same result.
__device__ __forceinline__ void warp_chan(float& n, float& mean, float& m2) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const float nb = __shfl_xor_sync(0xffffffffu, n, o), mb = __shfl_xor_sync(0xffffffffu, mean, o),
                m2b = __shfl_xor_sync(0xffffffffu, m2, o);
    chan(n, mean, m2, nb, mb, m2b);
  }
}

template <int CW, int VPT, int D, int L, int P, int B, bool H, bool RMS, int MODE>
__device__ __forceinline__ void grid_norm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          const bf16* __restrict__ b, bf16* __restrict__ y, uint64_t* part,
                                          unsigned* ctl, int rows, int n, int S, long long sx, long long sy,
                                          float eps) {
  constexpr int CT = 32 * CW;            // compute threads
  constexpr int KW = 5;                  // partials a lane polls: G <= 160
  constexpr int WORDS = RMS ? 1 : 2;     // 64-bit words a partial
  constexpr int PP = RMS ? P : (P + 1) / 2;  // rows a poll round (LayerNorm's two words: half, no spills)
  static_assert(L >= 1 && L < D, "the lag must leave stages to load into");
  const int c = blockIdx.x, G = gridDim.x, tid = threadIdx.x, lane = tid & 31;
  const int col0 = c * S, nc = min(S, n - col0), nv = nc / 8;  // the loader keeps nc > 0, nc % 8 == 0

  extern __shared__ __align__(128) unsigned char dsm[];
  bf16* xs = reinterpret_cast<bf16*>(dsm);  // (D, S) the ring
  __shared__ __align__(8) uint64_t full[D], empty[D], reduced[D], ready[D];
  __shared__ float2 wpart[D][CW];            // each warp's (mean or 0, m2 or sum x^2)
  __shared__ float2 stat[D];                 // the row's (mean, rstd)
  __shared__ unsigned tag_s;

  if (tid == 0) {
    for (int s = 0; s < D; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], CW);
      mbar_init(&reduced[s], CW);
      mbar_init(&ready[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    tag_s = *reinterpret_cast<volatile unsigned*>(ctl) + 1;
  }
  __syncthreads();
  const unsigned tag = tag_s;
  uint64_t pol_stream, pol_keep;
  l2_policies(pol_stream, pol_keep);

  if (tid >= CT + 32) {  // the producer
    if (tid != CT + 32) return;
    for (int j = 0; j < rows; ++j) {
      const int s = j % D;
      if (j >= D) mbar_wait(&empty[s], ((j / D) - 1) & 1);
      mbar_expect(&full[s], 2u * nc);
      bulk_load<H>(xs + s * S, x + j * sx + col0, 2u * nc, &full[s], pol_stream);
    }
    return;
  }

  // The 16-byte vectors of warp wp's lanes that lie in the slice, as elements (LayerNorm counts).
  auto warp_count = [&](int wp) {
    int k = 0;
#pragma unroll
    for (int q = 0; q < VPT; ++q) k += max(0, min(32, nv - (wp * 32 + q * CT)));
    return 8.f * k;
  };

  if (tid >= CT) {  // the exchange warp
    int pub = 0, post = MODE == 1 ? rows : 0;  // (the copy has no statistics)
    const float cw_n = lane < CW ? warp_count(lane) : 0.f;
    while (post < rows) {
      bool moved = false;
      // publish (each lane's own acquire: a row counts once every lane has seen it reduced)
      while (pub < rows && __all_sync(0xffffffffu, mbar_test(&reduced[pub % D], (pub / D) & 1))) {
        const int s = pub % D;
        const float2 v = lane < CW ? wpart[s][lane] : make_float2(0.f, 0.f);
        float cn = cw_n, mean = v.x, m2 = v.y;
        if (RMS) m2 = warp_sum(m2);
        else warp_chan(cn, mean, m2);
        if (MODE == 2) {  // diagnostic: this CTA's own statistics
          if (lane == 0) {
            stat[s] = make_float2(mean, rsqrtf(m2 / nc + eps));
            mbar_arrive(&ready[s]);
          }
          ++post;
        } else if (lane == 0) {
          st_relaxed(part + (static_cast<long long>(pub) * G + c) * WORDS, tagged(tag, RMS ? m2 : mean));
          if (!RMS) st_relaxed(part + (static_cast<long long>(pub) * G + c) * WORDS + 1, tagged(tag, m2));
        }
        ++pub;
        moved = true;
      }
      const int hi = min(post + PP, pub);
      if (MODE != 2 && hi > post) {  // poll rows post .. hi - 1 at once
        uint64_t v[PP][KW][WORDS];
#pragma unroll
        for (int p = 0; p < PP; ++p)
#pragma unroll
          for (int k = 0; k < KW; ++k)
#pragma unroll
            for (int q = 0; q < WORDS; ++q) {
              const int idx = lane + 32 * k;
              v[p][k][q] = (post + p < hi && idx < G)
                               ? ld_relaxed(part + (static_cast<long long>(post + p) * G + idx) * WORDS + q)
                               : tagged(tag, 0.f);
            }
#pragma unroll
        for (int p = 0; p < PP; ++p) {
          const int row = post;
          if (row >= hi) break;
          bool ok = true;
#pragma unroll
          for (int k = 0; k < KW; ++k)
#pragma unroll
            for (int q = 0; q < WORDS; ++q) ok &= static_cast<unsigned>(v[p][k][q] >> 32) == tag;
          if (!__all_sync(0xffffffffu, ok)) break;
          float cn = 0.f, mean = 0.f, m2 = 0.f;
#pragma unroll
          for (int k = 0; k < KW; ++k) {
            const int idx = lane + 32 * k;
            const float a = __uint_as_float(static_cast<unsigned>(v[p][k][0]));
            if (RMS) {
              m2 += a;
            } else if (idx < G) {
              const float nk = static_cast<float>(min(S, n - idx * S));
              chan(cn, mean, m2, nk, a, __uint_as_float(static_cast<unsigned>(v[p][k][WORDS - 1])));
            }
          }
          if (RMS) m2 = warp_sum(m2);
          else warp_chan(cn, mean, m2);
          if (lane == 0) {
            stat[row % D] = make_float2(mean, rsqrtf(m2 / n + eps));
            mbar_arrive(&ready[row % D]);
          }
          ++post;
          moved = true;
        }
      }
      if (!moved) __nanosleep(32);
    }
    if (lane == 0 && atomicAdd(ctl + 1, 1u) == static_cast<unsigned>(G) - 1) {  // the last CTA out
      atomicExch(ctl + 1, 0u);
      atomicExch(ctl, tag);
    }
    return;
  }

  // The compute warps.
  const int wp = tid >> 5;
  uint4 wr[VPT], br[RMS ? 1 : VPT];
#pragma unroll
  for (int q = 0; q < VPT; ++q) {
    const int vi = tid + q * CT;
    if (vi < nv) {
      wr[q] = __ldg(reinterpret_cast<const uint4*>(w + col0) + vi);
      if (!RMS) br[q] = __ldg(reinterpret_cast<const uint4*>(b + col0) + vi);
    }
  }
  const float my_n = warp_count(wp);
  constexpr int LAG = MODE == 1 ? 0 : L;
  static_assert(L % B == 0 && D > L + B, "whole batches; a stage to load while a batch is held");
  for (int i0 = 0; i0 < rows + LAG; i0 += B) {
    if (MODE != 1 && i0 < rows) {  // the partials of rows i0 .. i0 + B - 1 (the waits first,
      float f[B][VPT][8], s1[B];    // then B independent shuffle chains)
#pragma unroll
      for (int k = 0; k < B; ++k)
        if (i0 + k < rows) mbar_wait(&full[(i0 + k) % D], ((i0 + k) / D) & 1);
#pragma unroll
      for (int k = 0; k < B; ++k) {
        const uint4* xv = reinterpret_cast<const uint4*>(xs + ((i0 + k) % D) * S);
        s1[k] = 0.f;
#pragma unroll
        for (int q = 0; q < VPT; ++q) {
          const int vi = tid + q * CT;
          if (vi < nv && i0 + k < rows) unpack8(xv[vi], f[k][q]);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (vi >= nv || i0 + k >= rows) f[k][q][e] = 0.f;
            s1[k] += RMS ? f[k][q][e] * f[k][q][e] : f[k][q][e];
          }
        }
      }
#pragma unroll
      for (int k = 0; k < B; ++k) s1[k] = warp_sum(s1[k]);
      float mean[B];
#pragma unroll
      for (int k = 0; k < B; ++k) {
        mean[k] = 0.f;
        if (!RMS) {
          mean[k] = my_n > 0.f ? s1[k] / my_n : 0.f;
          float d2 = 0.f;
#pragma unroll
          for (int q = 0; q < VPT; ++q)
            if (tid + q * CT < nv)
#pragma unroll
              for (int e = 0; e < 8; ++e) d2 += (f[k][q][e] - mean[k]) * (f[k][q][e] - mean[k]);
          s1[k] = d2;
        }
      }
      if (!RMS)
#pragma unroll
        for (int k = 0; k < B; ++k) s1[k] = warp_sum(s1[k]);
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < B; ++k)
          if (i0 + k < rows) {
            wpart[(i0 + k) % D][wp] = make_float2(mean[k], s1[k]);
            mbar_arrive(&reduced[(i0 + k) % D]);
          }
    }
    const int r0 = i0 - LAG;
    if (r0 >= 0 && r0 < rows) {  // y of rows r0 .. r0 + B - 1
      float2 mr[B];
#pragma unroll
      for (int k = 0; k < B; ++k) {
        const int r = r0 + k, st = r % D;
        mr[k] = make_float2(0.f, 1.f);
        if (r >= rows) continue;
        if (MODE == 1) {
          mbar_wait(&full[st], (r / D) & 1);
        } else {
          mbar_wait(&ready[st], (r / D) & 1);
          mr[k] = stat[st];
        }
      }
#pragma unroll
      for (int k = 0; k < B; ++k) {
        const int r = r0 + k;
        if (r >= rows) continue;
        const uint4* xv = reinterpret_cast<const uint4*>(xs + (r % D) * S);
        uint4* yv = reinterpret_cast<uint4*>(y + r * sy + col0);
#pragma unroll
        for (int q = 0; q < VPT; ++q) {
          const int vi = tid + q * CT;
          if (vi >= nv) continue;
          uint4 out = xv[vi];
          if (MODE != 1) out = norm_vec<RMS>(out, wr[q], br + q, mr[k]);
          st_stream<H>(yv + vi, out, pol_stream);
        }
      }
      __syncwarp();
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < B; ++k)
          if (r0 + k < rows) mbar_arrive(&empty[(r0 + k) % D]);
    }
  }
}

// extern "C" entry points: grid_{rms|layer|copy|own}_w{CW}_v{VPT}_d{D}_l{L}_p{P}_b{B}_h{H};
// CW + 2 warps.
#define GRID_NORM(KIND, RMS, MODE, CW, V, D, L, P, B, H)                                                     \
  extern "C" __global__ void __launch_bounds__(32 * (CW + 2))                                                \
      grid_##KIND##_w##CW##_v##V##_d##D##_l##L##_p##P##_b##B##_h##H(                                         \
          const bf16* x, const bf16* w, const bf16* b, bf16* y, uint64_t* part, unsigned* ctl, int rows,     \
          int n, int S, long long sx, long long sy, float eps) {                                             \
    grid_norm<CW, V, D, L, P, B, H, RMS, MODE>(x, w, b, y, part, ctl, rows, n, S, sx, sy, eps);              \
  }

#define GRID_ALL(CW, V, D, L, P, B, H)               \
  GRID_NORM(rms, true, 0, CW, V, D, L, P, B, H)      \
  GRID_NORM(layer, false, 0, CW, V, D, L, P, B, H)   \
  GRID_NORM(own, true, 2, CW, V, D, L, P, B, H)      \
  GRID_NORM(copy, true, 1, CW, V, D, L, P, B, H)

// CW V D L P B H: 8 compute warps and one vector a thread (slices up to 2048 columns: 256K
// over 128-132 CTAs, 128K over 64+); the ring's depth, the lag, the rows polled a round, the
// rows a compute iteration, evict-first hints on x and y (first run: B 1, hints on).
GRID_ALL(8, 1, 32, 8, 4, 1, 1)
GRID_ALL(8, 1, 32, 8, 8, 4, 0)
GRID_ALL(8, 1, 32, 8, 8, 4, 1)
GRID_ALL(8, 1, 40, 16, 8, 8, 0)
GRID_ALL(8, 1, 32, 8, 8, 2, 0)
GRID_ALL(4, 1, 32, 8, 8, 4, 0)
GRID_ALL(8, 2, 24, 8, 8, 4, 0)
