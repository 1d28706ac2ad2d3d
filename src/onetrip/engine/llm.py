"""Offline generation in a few lines: a model (or a checkpoint, hub id or preset), a batch of
prompts, completions back. The ``Scheduler`` batches them continuously underneath.

    llm = onetrip.LLM("checkpoints/Llama-3.2-1B-Instruct")            # or LLM(model, tokenizer=tok)
    outs = llm.generate(["The capital of France is", "1, 2, 3,"],
                        onetrip.SamplingParams(temperature=0.7, max_tokens=64, stop=["\\n"]))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason
    outs = llm.chat([{"role": "user", "content": "Hi"}])               # the chat template

Stop strings are found in the decoded text (``IncrementalDecoder``, so a character split
across tokens is whole before it is searched); the request is aborted with reason "stop"
at once and its text cut before the stop string.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from ..models.llama import Model
from .sampling import SamplingParams
from .scheduler import Scheduler
from .tokenizer import IncrementalDecoder, Tokenizer


@dataclass
class Completion:
    """One prompt's result. ``prompt`` and ``text`` are None without a tokenizer (id prompts);
    ``token_ids`` holds every generated id (a stop string's ids and the EOS included);
    ``finish_reason``: "stop" (EOS, stop_token_ids, a stop string) or "length"."""

    prompt: Optional[str]
    prompt_token_ids: list[int]
    text: Optional[str]
    token_ids: list[int]
    finish_reason: str


def stop_string_cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """(text cut before the earliest stop string, True), or (text, False) when none occurs."""
    cut = _find_stop(text, stops, 0)
    return (text, False) if cut < 0 else (text[:cut], True)


def _find_stop(text: str, stops: Sequence[str], start: int) -> int:
    """The index of the earliest stop string found at or after ``start``, or -1."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits, default=-1)


class StopText:
    """The text of one request as its tokens come, and the stop strings searched in it
    (``LLM`` and the server's engine thread). ``holdback``: characters of the end that a
    stop string may still begin in, which a stream holds back while the request runs."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str]):
        self.decoder = IncrementalDecoder(tokenizer)
        self.stops = tuple(stops)
        self.holdback = max(map(len, self.stops), default=1) - 1  # a stop may begin this far back
        self.text = ""
        self.stopped = False

    def push(self, ids: Sequence[int], finished: bool) -> bool:
        """Add tokens; True when a stop string ends the text (it is cut before it)."""
        start = max(0, len(self.text) - self.holdback)
        self.text += self.decoder.push(list(ids)) if ids else ""
        if finished:
            self.text += self.decoder.flush()
        if self.stops:
            cut = _find_stop(self.text, self.stops, start)
            if cut >= 0:
                self.text, self.stopped = self.text[:cut], True
        return self.stopped


class LLM:
    """Generation over a ``Scheduler``.

    model_or_spec: a ``Model`` (pass ``tokenizer=`` for text), or a string that
        ``engine.commands.load`` resolves (a checkpoint directory, a preset), loaded with
        ``dtype`` (None: the checkpoint's, float32 for a preset) on ``device`` (default:
        cuda when there is one).
    backend: the model's backend; None keeps a given Model's and picks "fused" on a GPU,
        "eager" on the CPU for a loaded one.
    tokenizer: a ``Tokenizer``, for a Model (a loaded directory brings its own).
    **scheduler_kwargs: the Scheduler's (max_seq, page_size, num_pages, prefill_chunk, prefill_tokens,
        graphs, eos_ids (default: the tokenizer's), memory_fraction).
    """

    def __init__(self, model_or_spec: Union[Model, str], *, dtype: Optional[torch.dtype] = None,
                 device: Optional[Union[str, torch.device]] = None, max_batch: int = 64,
                 tokenizer: Optional[Tokenizer] = None, backend: Optional[str] = None, **scheduler_kwargs: Any):
        if isinstance(model_or_spec, Model):
            if dtype is not None or device is not None:
                raise ValueError("dtype and device apply to a model LLM loads (a string spec); move the Model "
                                 "with model.to(...) before passing it")
            model = model_or_spec
        elif isinstance(model_or_spec, str):
            from .commands import load

            device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            model, loaded, _ = load(model_or_spec, dtype, str(device))
            tokenizer = tokenizer or loaded
            if backend is None:
                backend = "fused" if model.device.type == "cuda" else "eager"
        else:
            raise TypeError(f"model_or_spec must be a Model or a str (a checkpoint directory or a preset), "
                            f"got {type(model_or_spec).__name__}")
        if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer must be an onetrip.engine.Tokenizer, got {type(tokenizer).__name__}")
        if backend is not None:
            model.backend = backend
        self.model = model
        self.tokenizer = tokenizer
        scheduler_kwargs.setdefault("eos_ids", tokenizer.eos_ids if tokenizer is not None else ())
        self.scheduler = Scheduler(model, max_batch=max_batch, **scheduler_kwargs)
        self._ids = itertools.count()

    def generate(self, prompts: Union[str, Sequence[str], Sequence[Sequence[int]]],
                 params: Union[SamplingParams, Sequence[SamplingParams]] = SamplingParams(), *,
                 use_tqdm: bool = False) -> list[Completion]:
        """Complete every prompt: a str, a list of str (needs the tokenizer; encoded with its
        special tokens, the BOS), or a list of token-id lists (one list of ids is one
        prompt). ``params``: one SamplingParams for all, or one per prompt. Returns the
        completions in the prompts' order."""
        texts, ids = self._prompts(prompts)
        return self._run(texts, ids, params, use_tqdm)

    def chat(self, messages: Union[Sequence[Mapping[str, Any]], Sequence[Sequence[Mapping[str, Any]]]],
             params: Union[SamplingParams, Sequence[SamplingParams]] = SamplingParams(), *,
             use_tqdm: bool = False, **template_kwargs: Any) -> list[Completion]:
        """Complete one conversation ([{"role": ..., "content": ...}, ...]) or a list of them
        through the tokenizer's chat template, with the assistant's header appended.
        ``template_kwargs`` go to ``Tokenizer.apply_chat_template`` (template=,
        enable_thinking=, tools=, ...). ``Completion.prompt`` is the rendered text."""
        tok = self._need_tokenizer("chat")
        if isinstance(messages, Sequence) and messages and isinstance(messages[0], Mapping):
            messages = [messages]
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise TypeError(f"messages must be a conversation (a list of dicts) or a list of them, "
                            f"got {messages!r:.80}")
        texts = [tok.apply_chat_template(conv, add_generation_prompt=True, **template_kwargs) for conv in messages]
        return self._run(texts, [tok.encode(t, add_special_tokens=False) for t in texts], params, use_tqdm)

    # -- helpers ---------------------------------------------------------------------------------

    def _need_tokenizer(self, what: str) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{what} needs a tokenizer: pass tokenizer= with a Model, load a checkpoint directory "
                             f"with a tokenizer.json, or give prompts as token-id lists")
        return self.tokenizer

    def _prompts(self, prompts) -> tuple[list[Optional[str]], list[list[int]]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or not prompts:
            raise ValueError(f"prompts must be a str, a non-empty list of str or of token-id lists, "
                             f"got {prompts!r:.80}")
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
            prompts = [prompts]  # one prompt of ids
        if all(isinstance(p, str) for p in prompts):
            tok = self._need_tokenizer("text prompts")
            return list(prompts), [tok.encode(p) for p in prompts]
        if any(isinstance(p, str) or not isinstance(p, Sequence) for p in prompts):
            raise TypeError(f"prompts must be all str or all token-id lists, got {prompts!r:.80}")
        return [None] * len(prompts), [list(p) for p in prompts]

    def _run(self, texts: list[Optional[str]], ids: list[list[int]], params, use_tqdm: bool) -> list[Completion]:
        if isinstance(params, SamplingParams):
            params = [params] * len(ids)
        params = list(params)
        if len(params) != len(ids) or not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError(f"params must be a SamplingParams or a list of {len(ids)} (one per prompt), "
                             f"got {params!r:.80}")
        sched = self.scheduler
        names = [f"llm-{next(self._ids)}" for _ in ids]
        streams: dict[str, Optional[StopText]] = {}
        results: dict[str, tuple[list[int], str]] = {}
        try:
            for name, prompt, p in zip(names, ids, params):
                sched.add_request(name, prompt, p)
                streams[name] = StopText(self.tokenizer, p.stop) if self.tokenizer is not None and p.stop else None
            with _progress(len(ids), use_tqdm) as advance:
                while len(results) < len(ids):
                    for out in sched.step():
                        if out.request_id not in streams:  # someone else's, through llm.scheduler
                            continue
                        stream, finished, reason = streams[out.request_id], out.finished, out.finish_reason
                        if stream is not None and stream.push(out.new_token_ids, finished):
                            if not finished:
                                sched.abort(out.request_id, reason="stop")
                            finished, reason = True, "stop"
                        if finished:
                            results[out.request_id] = (out.token_ids, reason)
                            advance()
        finally:  # a refused prompt or an interrupted call leaves nothing behind in the scheduler
            for name in names:
                sched.abort(name)
        completions = []
        for name, text, prompt in zip(names, texts, ids):
            tokens, reason = results[name]
            stream = streams[name]
            if stream is not None:
                out_text = stream.text
            elif self.tokenizer is not None:
                out_text = self.tokenizer.decode(tokens)
            else:
                out_text = None
            completions.append(Completion(text, prompt, out_text, tokens, reason))
        return completions


class _progress:
    """A progress bar of finished requests (rich, or tqdm when rich is missing); a no-op off."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar = total, enabled, None

    def __enter__(self):
        if not self.enabled:
            return lambda: None
        try:
            from rich.progress import Progress

            self.bar = Progress(transient=True)
            self.bar.__enter__()
            task = self.bar.add_task("generate", total=self.total)
            return lambda: self.bar.update(task, advance=1)
        except ImportError:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc="generate")
            return lambda: self.bar.update(1)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
