"""The engine thread behind ``onetrip serve``: one thread owns the ``Scheduler``; the HTTP side
sends it commands through a thread-safe queue and gets each request's output back on an
asyncio queue of its own.

    runner = EngineRunner(Scheduler(model, max_batch=64, eos_ids=tok.eos_ids), tok).start()
    events = runner.add("cmpl-1", prompt_ids, params)   # on the event loop: an asyncio.Queue
    await events.get()        # None: accepted; an exception: refused (e.g. ValueError)
    delta = await events.get()  # Delta(text, token_ids, ..., finished, finish_reason), until finished
    runner.abort("cmpl-1")    # the client left: its pages are freed before the next step
    runner.shutdown()         # aborts what is left, joins the thread

The Scheduler is not thread-safe, so the engine thread is its only caller. With nothing
unfinished the thread blocks on the command queue (no spinning); otherwise it drains the
queue, then runs one ``step()``, so an add or an abort takes effect within one step.
Each ``RequestOutput`` becomes a ``Delta`` delivered with ``loop.call_soon_threadsafe``.

Text, when there is a tokenizer: a ``StopText`` per request (``engine/llm.py``, as ``LLM``
has it) turns the new ids into new text (never half a character). Stop strings (``SamplingParams.stop``) are found
here, not in the scheduler: the text is cut before the first one and the request is
aborted with ``reason="stop"`` at once. While a request runs, the last
``max(len(stop)) - 1`` characters are held back, since they may be the start of a stop
string; the stream therefore never shows text that the final answer cuts.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from ..engine.llm import StopText
from ..engine.sampling import SamplingParams
from ..engine.scheduler import Scheduler
from ..engine.tokenizer import Tokenizer

logger = logging.getLogger("onetrip.serve")


@dataclass(frozen=True)
class Delta:
    """What one engine step added to a request.

    text: the new text ('' when the new tokens complete no character, or all of it is held
        back for the stop strings); None without a tokenizer.
    token_ids: the new token ids (those past a stop string included).
    prompt_tokens, completion_tokens: the prompt's length and the tokens generated so far.
    finished, finish_reason: "stop" (EOS, stop_token_ids, a stop string), "length", "abort".
    """

    text: Optional[str]
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    finished: bool
    finish_reason: Optional[str]


class EngineStopped(RuntimeError):
    """Delivered to the requests still running when the runner shuts down."""


@dataclass
class _Live:
    """Engine-thread state of one running request."""

    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    prompt_tokens: int
    text: Optional[StopText]  # None without a tokenizer
    sent: int = 0      # characters of ``text.text`` delivered
    generated: int = 0  # tokens so far (reading RequestOutput.token_ids would copy them every step)


_STOP = object()


class EngineRunner:
    """Runs a Scheduler on a thread of its own (module docstring).

    Args:
        scheduler: the ``engine.scheduler.Scheduler``, not started on any other thread.
        tokenizer: the model's ``Tokenizer``, or None (token ids in and out only).

    ``max_model_len`` (prompt + new tokens per request) is the scheduler's max_seq;
    ``vocab_size`` its model's.
    """

    def __init__(self, scheduler: Scheduler, tokenizer: Optional[Tokenizer]):
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.max_model_len: int = scheduler.max_seq
        self.vocab_size: int = scheduler.model.config.vocab_size
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="onetrip-engine", daemon=True)

    # -- the HTTP side (any thread; ``add`` on the event loop that will read the queue) ----------

    def start(self) -> "EngineRunner":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> asyncio.Queue:
        """Queue a request; returns the asyncio queue its events arrive on: first None
        (accepted) or the exception ``add_request`` raised, then ``Delta``s up to a
        finished one (or an exception: the step failed, or ``EngineStopped``). Call from
        the event loop that reads the queue. Raises EngineStopped once the thread ended."""
        events: asyncio.Queue = asyncio.Queue()
        with self._lock:  # no add slips in after the thread's last look at the queue
            if self._stopped or not self._thread.is_alive():
                raise EngineStopped("the engine is not running")
            self._commands.put(("add", request_id, (list(prompt_ids), params, events, asyncio.get_running_loop())))
        return events

    def abort(self, request_id: str) -> None:
        """Abort a request (a client that left): its pages are freed before the next step.
        Nothing more is delivered to its queue. Unknown or finished ids are ignored."""
        self._commands.put(("abort", request_id, None))

    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Abort every request (their queues get an ``EngineStopped``) and join the thread."""
        if self._thread.is_alive():
            self._commands.put(_STOP)
            self._thread.join(timeout)

    # -- the engine thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            device = self.scheduler.model.device
            if device.type == "cuda":  # the current device is per thread, and Triton launches on it
                torch.cuda.set_device(device)
            with torch.no_grad():  # so is grad mode
                while self._turn():
                    pass
        except Exception:
            logger.exception("the engine thread failed")
        finally:
            with self._lock:
                self._stopped = True
            stopped = EngineStopped("the engine stopped (the server is shutting down)")
            self._fail_all(stopped)
            while True:  # adds queued before the flag was set
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command is not _STOP and command[0] == "add":
                    _post(command[2][3], command[2][2], stopped)

    def _turn(self) -> bool:
        """The queued commands (blocking for one when nothing is unfinished), then one step.
        False on the stop command."""
        commands = [] if self.scheduler.has_unfinished() else [self._commands.get()]
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for command in commands:
            if command is _STOP:
                return False
            self._command(*command)
        if self.scheduler.has_unfinished():
            self._step()
        return True

    def _command(self, kind: str, request_id: str, payload) -> None:
        if kind == "abort":
            if self._live.pop(request_id, None) is not None:
                try:
                    self.scheduler.abort(request_id)
                except Exception:  # its client is gone; the server goes on
                    logger.exception("abort of %s failed", request_id)
            return
        prompt_ids, params, events, loop = payload
        try:
            self.scheduler.add_request(request_id, prompt_ids, params)
        except Exception as exc:  # ValueError/TypeError: the scheduler's checks (a 400); else a 500
            _post(loop, events, exc)
            return
        self._live[request_id] = _Live(events, loop, len(prompt_ids),
                                       StopText(self.tokenizer, params.stop) if self.tokenizer else None)
        _post(loop, events, None)

    def _step(self) -> None:
        try:
            outputs = self.scheduler.step()
        except Exception as exc:  # a failed step fails the requests in flight, not the server
            logger.exception("engine step failed; failing %d request(s)", len(self._live))
            self._fail_all(exc)
            return
        posts: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is None:  # aborted by its client after the step began
                continue
            delta = self._delta(out.request_id, live, out)
            if delta.finished:
                del self._live[out.request_id]
            posts.setdefault(live.loop, []).append((live.events, delta))
        for loop, items in posts.items():  # one wake-up of the event loop per step, not per request
            _post_all(loop, items)

    def _delta(self, request_id: str, live: _Live, out) -> Delta:
        new_ids = out.new_token_ids
        live.generated += len(new_ids)
        generated = live.generated
        finished, reason = out.finished, out.finish_reason
        if live.text is None:
            return Delta(None, new_ids, live.prompt_tokens, generated, finished, reason)
        if live.text.push(new_ids, finished):  # a stop string: the text is cut before it
            if not finished:
                self.scheduler.abort(request_id, reason="stop")
            finished, reason = True, "stop"
        full = live.text.text
        end = len(full) if finished else max(live.sent, len(full) - live.text.holdback)
        text, live.sent = full[live.sent:end], end
        return Delta(text, new_ids, live.prompt_tokens, generated, finished, reason)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id, live in list(self._live.items()):
            try:
                self.scheduler.abort(request_id)
            except Exception:  # the scheduler is already broken; the client still gets its error
                logger.exception("abort of %s failed", request_id)
            _post(live.loop, live.events, exc)
        self._live.clear()


def _post(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, item) -> None:
    _post_all(loop, [(events, item)])


def _post_all(loop: asyncio.AbstractEventLoop, items: list) -> None:
    """Put each (asyncio queue, item) of ``items`` on its queue, on ``loop``'s thread."""
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


def _put_all(items: list) -> None:
    for events, item in items:
        events.put_nowait(item)
