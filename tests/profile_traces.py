"""A builder for synthetic Kineto (Chrome trace) files, shaped like PyTorch's profiler output.

    b = TraceBuilder()
    b.step(1, 0, 1000)
    ext = b.op("aten::add", 0, 5, dims=[[8, 4096], [8, 4096]], types=["c10::BFloat16"] * 2)
    b.launched_kernel(EW_ADD, launch_ts=1, k_ts=10, k_dur=4, ext=ext)
    b.write(tmp_path / "t.json")

Each event carries the fields Kineto writes (ph, cat, name, pid, tid, ts, dur, args with
correlation / External id / device / stream / grid / block), plus the noise a real trace
has (process metadata, python_function spans, ac2g flow arrows, GPU step annotations) so
that the reader's filtering is exercised.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

# Kernel names as PyTorch / cuBLAS / FlashAttention print them.
EW_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"
EW_MUL = "void at::native::unrolled_elementwise_kernel<at::native::binary_internal::MulFunctor<float>, at::detail::Array<char*, 3> >(int, at::native::binary_internal::MulFunctor<float>, at::detail::Array<char*, 3>)"
EW_COPY = "void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1})"
REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)"
RMS = "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
NVJET = "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN"
FLASH = "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)"
CAST = "cast_fp32_to_bf16_kernel"
SOFTMAX = "void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, (anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
BF16 = "c10::BFloat16"


class TraceBuilder:
    """Accumulates events; ids (correlation, External id) are handed out in order from 1."""

    def __init__(self, pid: int = 1234, tid: int = 1234, device: int = 0, noise: bool = True):
        self.events: list[dict] = []
        self.pid, self.tid, self.device = pid, tid, device
        self._corr = self._ext = 0
        if noise:
            self.events += [
                {"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": "python"}},
                {"name": "process_name", "ph": "M", "ts": 0, "pid": device, "tid": 0, "args": {"name": "GPU 0"}},
            ]
        self.noise = noise

    def step(self, n: int, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": self.pid,
                            "tid": self.tid, "ts": ts, "dur": dur, "args": {"External id": self._next_ext()}})
        if self.noise:  # Kineto mirrors the step on the GPU timeline; it must not count as a step
            self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}",
                                "pid": self.device, "tid": 7, "ts": ts, "dur": dur, "args": {}})

    def op(self, name: str, ts: float, dur: float, dims=None, types=None, tid: int | None = None) -> int:
        ext = self._next_ext()
        args = {"External id": ext, "Record function id": 0, "Sequence number": ext}
        if dims is not None:
            args["Input Dims"] = dims
            args["Input type"] = types if types is not None else [BF16] * len(dims)
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": self.pid, "tid": tid or self.tid,
                            "ts": ts, "dur": dur, "args": args})
        return ext

    def launch(self, ts: float, dur: float = 4.0, ext: int | None = None, name: str = "cudaLaunchKernel") -> int:
        self._corr += 1
        args = {"cbid": 211, "correlation": self._corr}
        if ext is not None:
            args["External id"] = ext
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": self.tid,
                            "ts": ts, "dur": dur, "args": args})
        return self._corr

    def kernel(self, name: str, ts: float, dur: float, corr: int | None = None, ext: int | None = None,
               stream: int = 7, cat: str = "kernel", graph_id: int | None = None, device: int | None = None) -> None:
        device = self.device if device is None else device
        args = {"queued": 0, "device": device, "context": 1, "stream": stream,
                "registers per thread": 32, "shared memory": 0, "grid": [128, 1, 1], "block": [256, 1, 1]}
        if corr is not None:
            args["correlation"] = corr
        if ext is not None:
            args["External id"] = ext
        if graph_id is not None:
            args["graph id"] = graph_id
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream,
                            "ts": ts, "dur": dur, "args": args})
        if self.noise and corr is not None:
            self.events.append({"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": ts,
                                "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def launched_kernel(self, name: str, launch_ts: float, k_ts: float, k_dur: float, ext: int | None = None,
                        launch_dur: float = 4.0, stream: int = 7) -> int:
        """A cudaLaunchKernel at launch_ts and the kernel it launched; returns the correlation."""
        corr = self.launch(launch_ts, launch_dur, ext)
        self.kernel(name, k_ts, k_dur, corr, ext, stream)
        return corr

    def python(self, name: str, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "python_function", "name": name, "pid": self.pid, "tid": self.tid,
                            "ts": ts, "dur": dur, "args": {"Python id": 1, "Python parent id": 0}})

    def to_dict(self) -> dict:
        return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
                "traceEvents": self.events, "traceName": "synthetic", "displayTimeUnit": "ms",
                "baseTimeNanoseconds": 1700000000000000000}

    def write(self, path: Path, indent: int | None = None) -> Path:
        path = Path(path)
        text = json.dumps(self.to_dict(), indent=indent)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as fh:
                fh.write(text)
        else:
            path.write_text(text)
        return path

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext


def write_large_trace(path: Path, target_bytes: int, max_steps: int | None = None) -> int:
    """Write a trace of about ``target_bytes`` (or ``max_steps`` steps) without holding it in
    memory: repeated steps of an eager layer (add, rms norm, gemm, mul), each kernel launched
    after the previous one ended. Returns the number of kernels written.

    tests/data/profile_eager_layer.json.gz is ``write_large_trace(path, 10**9, max_steps=5)``,
    gzipped."""
    kernels = 0
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [\n')
        t, step, first = 0.0, 0, True
        while fh.tell() < target_bytes and (max_steps is None or step < max_steps):
            b = TraceBuilder(noise=True)
            b._corr = b._ext = step * 10_000
            b.step(step, t, 400)
            for j, (name, opname) in enumerate(((EW_ADD, "aten::add"), (RMS, "aten::rms_norm"),
                                                (GEMM, "aten::mm"), (EW_MUL, "aten::mul")) * 8):
                ts = t + 10 + 12 * j
                ext = b.op(opname, ts, 10, dims=[[16, 4096], [16, 4096]])
                b.python("torch/nn/modules/module.py(1736): _call_impl", ts - 1, 12)
                b.launched_kernel(name, ts + 2, ts + 6, 5, ext)
                kernels += 1
            for ev in b.events:
                fh.write(("" if first else ",\n") + json.dumps(ev))
                first = False
            t += 400
            step += 1
        fh.write('\n], "traceName": "large"}\n')
    return kernels


def eager_steps(b: TraceBuilder, steps: int = 3, kernels: int = 8) -> TraceBuilder:
    """``steps`` ProfilerSteps (#0, #1...) 1000 µs apart, each ``kernels`` element-wise adds of
    4 µs, each launched after the previous one ended: per step, kernels run at
    t0 + 16 + 10 j, wall 10 * kernels - 6, busy 4 * kernels, all idle time host-wait (6 µs gaps)."""
    for n in range(steps):
        t0 = 1000.0 * n
        b.step(n, t0, 1000)
        for j in range(kernels):
            ext = b.op("aten::add", t0 + 9 + 10 * j, 8, [[1024, 1024], [1024, 1024]], ["float", "float"])
            b.launched_kernel(EW_ADD, t0 + 10 + 10 * j, t0 + 16 + 10 * j, 4, ext)
    return b


def fused_steps(b: TraceBuilder, steps: int = 3) -> TraceBuilder:
    """Steps like ``eager_steps``' with two queued kernels each: a norm [t0 + 20, t0 + 40] and a
    gemm [t0 + 41, t0 + 71]: wall 51, busy 50, one 1 µs kernel-wait gap."""
    for n in range(steps):
        t0 = 1000.0 * n
        b.step(n, t0, 1000)
        b.launched_kernel(RMS, t0 + 10, t0 + 20, 20, b.op("aten::rms_norm", t0 + 9, 4))
        b.launched_kernel(GEMM, t0 + 12, t0 + 41, 30, b.op("aten::mm", t0 + 11, 4))
    return b
