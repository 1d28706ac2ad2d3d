"""Streaming reader for PyTorch profiler traces (Kineto's Chrome trace format).

    trace = read_trace("run.pt.trace.json.gz")
    trace.kernels[0].name, trace.kernels[0].dur

A Kineto trace is one JSON object whose ``"traceEvents"`` key holds an array of events
(``{"ph": "X", "cat": "kernel", "name": ..., "ts": µs, "dur": µs, "args": {...}}``). Traces
of a few steps of a large model reach gigabytes, so the file is never loaded whole: it is
read in 1 MiB chunks (through gzip when it starts with gzip's magic bytes), and each
array element is decoded on its own with ``json.JSONDecoder.raw_decode`` over a sliding
buffer. Only the events the analyses need are kept, as small named tuples:

    cat ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``  -> ``Kernel``
    cat ``cuda_runtime`` / ``cuda_driver``            -> ``RuntimeCall`` (launches, syncs)
    cat ``cpu_op``                                    -> ``CpuOp`` (with input dims/types)
    name ``ProfilerStep#N`` (not on the GPU)          -> ``Step``

Older Kineto spellings (``Kernel``, ``Runtime``, ``Operator``, ``Memcpy``, ``Memset``) are
accepted. A file that is not JSON, is cut short, or has no ``traceEvents`` raises a
``ValueError`` that names the file, the character offset, and what is wrong; so does
``read_trace`` on a trace with no events at all.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Iterator, NamedTuple

CHUNK_CHARS = 1 << 20
MAX_EVENT_CHARS = 64 << 20  # one event larger than this is treated as corrupt, not incomplete
END_MARGIN = 16  # characters from the buffer's end within which a decode error may mean "more to read"
GZIP_MAGIC = b"\x1f\x8b"

KERNEL_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
               "gpu_memset": "memset", "memset": "memset"}
RUNTIME_CATS = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
CPU_OP_CATS = frozenset({"cpu_op", "operator"})
GRAPH_ID_KEYS = ("graph id", "graph_id", "graphId")


class Kernel(NamedTuple):
    """One GPU activity. ``kind`` is "kernel", "memcpy" or "memset"; times in µs."""

    name: str
    kind: str
    device: int
    stream: int
    ts: float
    dur: float
    correlation: int | None
    external_id: int | None
    graph_id: int | None
    grid: tuple | None
    block: tuple | None

    @property
    def end(self) -> float:
        return self.ts + self.dur


class RuntimeCall(NamedTuple):
    """A CUDA runtime/driver API call on a CPU thread (cudaLaunchKernel, cudaGraphLaunch...)."""

    name: str
    tid: int
    ts: float
    dur: float
    correlation: int | None
    external_id: int | None


class CpuOp(NamedTuple):
    """An operator span on a CPU thread; ``input_dims``/``input_types`` when shapes were recorded."""

    name: str
    tid: int
    ts: float
    dur: float
    external_id: int | None
    input_dims: tuple | None
    input_types: tuple | None


class Step(NamedTuple):
    """A ``ProfilerStep#N`` span on the CPU."""

    name: str
    number: int
    ts: float
    dur: float


class Trace(NamedTuple):
    """What ``read_trace`` keeps of a trace; lists sorted by start time."""

    path: str
    kernels: list[Kernel]
    runtime: list[RuntimeCall]
    cpu_ops: list[CpuOp]
    steps: list[Step]
    metadata: dict
    events: int  # array elements read, all categories


class _Reader:
    """A sliding text buffer over a file with JSON decoding of one value at a time."""

    _WS = re.compile(r"[ \t\n\r]*")

    def __init__(self, fh, path: str):
        self.fh, self.path = fh, path
        self.buf, self.pos, self.base, self.eof = "", 0, 0, False
        self.decoder = json.JSONDecoder()

    def fail(self, what: str, pos: int | None = None) -> ValueError:
        offset = self.base + (self.pos if pos is None else pos)
        return ValueError(f"{self.path}: not a readable trace: {what} (at character {offset})")

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self.fh.read(CHUNK_CHARS)
        except EOFError as e:  # gzip stream cut short
            raise self.fail(f"truncated file ({e})") from None
        except (OSError, UnicodeDecodeError) as e:
            raise self.fail(f"cannot decode the file ({e})") from None
        if not data:
            self.eof = True
            return False
        self.base += self.pos
        self.buf = self.buf[self.pos:] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            self.pos = self._WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.fill():
                return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, char: str, context: str) -> None:
        c = self.peek()
        if c != char:
            raise self.fail(f"truncated file: ended {context}" if c == ""
                            else f"expected {char!r} {context}, found {c!r}")
        self.pos += 1

    def value(self):
        """Decode the next JSON value, reading more of the file until it is complete."""
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                # Input cut short fails within a few characters of its end ("tru", "1e", "\u12")
                # or as an unterminated string; an error earlier than that is in the data.
                at_end = e.pos >= len(self.buf) - END_MARGIN or e.msg.startswith("Unterminated string")
                if not at_end or len(self.buf) - self.pos > MAX_EVENT_CHARS:
                    raise self.fail(f"invalid JSON: {e.msg}", e.pos) from None
                if self.fill():
                    continue
                raise self.fail("truncated file: ended inside a value") from None
            if end == len(self.buf) and self.fill():  # a number may continue in the next chunk
                continue
            self.pos = end
            return obj

    def array(self, closing_optional: bool) -> Iterator:
        """Yield the elements of an array whose '[' was consumed."""
        first = True
        while True:
            c = self.peek()
            if c == "]" and first:
                self.pos += 1
                return
            if not first:
                if c == "]":
                    self.pos += 1
                    return
                if c not in (",", ""):  # "" (end of file) is handled below
                    raise self.fail(f"invalid JSON: expected ',' or ']' after an event, found {c!r}")
                if c == ",":
                    self.pos += 1
                    c = self.peek()
            if c == "":
                if closing_optional:  # Chrome's array format allows the ']' to be missing
                    return
                raise self.fail("truncated file: the traceEvents array is not closed")
            if c in ",]":
                raise self.fail(f"invalid JSON: {c!r} where an event should be")
            yield self.value()
            first = False

    def members(self) -> Iterator[str]:
        """Yield the keys of an object whose '{' was consumed, leaving each value to the caller."""
        first = True
        while True:
            c = self.peek()
            if c == "}" and first:
                self.pos += 1
                return
            if not first:
                if c == "}":
                    self.pos += 1
                    return
                if c == "":
                    raise self.fail("truncated file: the top-level object is not closed")
                if c != ",":
                    raise self.fail(f"invalid JSON: expected ',' or '}}' after a value, found {c!r}")
                self.pos += 1
                c = self.peek()
            if c == "":
                raise self.fail("truncated file: the top-level object is not closed")
            if c != '"':
                raise self.fail(f"invalid JSON: expected a key, found {c!r}")
            key = self.value()
            self.expect(":", f"after key {key!r}")
            yield key
            first = False


def _open_text(path: Path):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == GZIP_MAGIC:
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, "rt", encoding="utf-8-sig")


def iter_events(path: str | Path, metadata: dict | None = None) -> Iterator[dict]:
    """Yield the trace's events one by one, holding at most a chunk and one event in memory.

    Accepts the object form ``{"traceEvents": [...], ...}`` and the bare array form. The
    object's other keys (``deviceProperties``, ``baseTimeNanoseconds``...) go into
    ``metadata`` when a dict is given.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file")
    with _open_text(path) as fh:
        r = _Reader(fh, str(path))
        first = r.peek()
        if first == "[":
            r.pos += 1
            for ev in r.array(closing_optional=True):
                if isinstance(ev, dict):
                    yield ev
            return
        if first != "{":
            raise r.fail("empty file" if first == "" else f"expected a JSON object or array, found {first!r}")
        r.pos += 1
        found = False
        for key in r.members():
            if key == "traceEvents":
                r.expect("[", "as the start of the traceEvents array")
                found = True
                for ev in r.array(closing_optional=False):
                    if isinstance(ev, dict):
                        yield ev
            else:
                val = r.value()
                if metadata is not None:
                    metadata[key] = val
        if not found:
            raise r.fail("no 'traceEvents' array in the top-level object")
        if r.peek() != "":
            raise r.fail(f"invalid JSON: {r.peek()!r} after the end of the top-level object")


def _int(x) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _tuple(x) -> tuple | None:
    if not isinstance(x, list):
        return None
    return tuple(_tuple(v) if isinstance(v, list) else v for v in x)


def read_trace(path: str | Path) -> Trace:
    """Stream ``path`` and keep the kernels, runtime calls, cpu ops and steps (see module doc).

    Raises ValueError naming the file when it holds no events (``{"traceEvents": []}``).
    Input shapes repeat across steps, so equal ``input_dims``/``input_types`` tuples and
    equal names are stored once (interned), which keeps a multi-GB trace's residue small.
    """
    kernels, runtime, ops, steps = [], [], [], []
    metadata: dict = {}
    interned: dict = {}
    intern = lambda v: interned.setdefault(v, v)  # noqa: E731
    n = 0
    for ev in iter_events(path, metadata):
        n += 1
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", "")).lower()
        name = ev.get("name", "")
        args = ev.get("args") or {}
        try:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        kind = KERNEL_CATS.get(cat)
        if kind is not None:
            graph = next((_int(args[k]) for k in GRAPH_ID_KEYS if k in args), None)
            kernels.append(Kernel(
                intern(name), kind, _int(args.get("device", ev.get("pid"))) or 0,
                _int(args.get("stream", ev.get("tid"))) or 0, ts, dur,
                _int(args.get("correlation")), _int(args.get("External id")), graph or None,
                intern(_tuple(args.get("grid"))), intern(_tuple(args.get("block")))))
        elif name.startswith("ProfilerStep#") and not cat.startswith("gpu"):
            steps.append(Step(name, _int(name.partition("#")[2]) or 0, ts, dur))
        elif cat in RUNTIME_CATS:
            runtime.append(RuntimeCall(intern(name), _int(ev.get("tid")) or 0, ts, dur,
                                       _int(args.get("correlation")), _int(args.get("External id"))))
        elif cat in CPU_OP_CATS:
            ops.append(CpuOp(intern(name), _int(ev.get("tid")) or 0, ts, dur, _int(args.get("External id")),
                             intern(_tuple(args.get("Input Dims"))), intern(_tuple(args.get("Input type")))))
    if n == 0:
        raise ValueError(f"{path}: empty trace: traceEvents holds no events, so there is nothing to analyse")
    for seq in (kernels, runtime, ops, steps):
        seq.sort(key=lambda e: e.ts)
    return Trace(str(path), kernels, runtime, ops, steps, metadata, n)
