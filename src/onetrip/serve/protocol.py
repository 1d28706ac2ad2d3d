"""The OpenAI request bodies ``onetrip serve`` accepts, and their checks.

Pydantic models give the types (a wrong type is a 400 through the app's validation
handler); ``sampling_params`` checks the values and builds the ``SamplingParams``, raising
``APIError`` (an OpenAI-shaped 400) naming the parameter, the value and what is allowed.
Unknown fields are ignored; OpenAI parameters that onetrip does not implement are refused
unless left at their default (``unsupported``).
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

from ..engine.sampling import SamplingParams


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Body(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    n: Optional[int] = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    return_token_ids: bool = False  # adds prompt_token_ids and token_ids to the choice (vLLM's name)
    # not implemented: refused unless at their default (``unsupported``)
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None


class CompletionBody(_Body):
    prompt: Union[list[int], list[list[int]], str, list[str]]
    echo: Any = None
    suffix: Any = None
    best_of: Any = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the template

    role: str
    content: Union[str, list[ContentPart], None] = None


class ChatBody(_Body):
    messages: list[Message]
    max_completion_tokens: Optional[int] = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None


# Values that mean "not used" for each parameter onetrip does not implement.
_DEFAULTS: dict[str, tuple] = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}), "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0), "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
}


def unsupported(body: _Body) -> None:
    """Raise a 400 for the first parameter onetrip does not implement that is set."""
    for name, defaults in _DEFAULTS.items():
        if name in type(body).model_fields and not any(getattr(body, name) == d for d in defaults):
            raise APIError(400, f"{name}={getattr(body, name)!r:.80} is not supported by this server; leave it out",
                           param=name, code="unsupported_parameter")


def chat_messages(body: ChatBody) -> list[dict]:
    """The messages as template input: content parts of type "text" joined, others refused."""
    messages = []
    for i, message in enumerate(body.messages):
        content = message.content
        if isinstance(content, list):
            for part in content:
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"messages[{i}].content: only text parts are supported, got type "
                                        f"{part.type!r}", param=f"messages.{i}.content")
            content = "".join(part.text for part in content)
        messages.append({**message.model_dump(exclude_none=True), "role": message.role, "content": content or ""})
    if not messages:
        raise APIError(400, "messages is empty; give at least one message", param="messages")
    return messages


def sampling_params(body: _Body, max_tokens: Optional[int], prompt_tokens: int, max_model_len: int,
                    prompt_param: str) -> SamplingParams:
    """Check the values of ``body`` and build its SamplingParams.

    max_tokens: the request's limit (max_completion_tokens or max_tokens), or None for what
    the context leaves. prompt_param: "messages" or "prompt", for the context error.
    OpenAI's defaults: temperature 1, top_p 1; top_k 0 (or vLLM's -1) and min_p 0 are off.
    seed None: a random one. A request's draws depend on its seed and its own token count
    only (``sampling.sample_rows``), not on the batch around it: a seed reproduces.
    """
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n} is not supported: one choice per request (n=1); send n requests",
                       param="n")
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    temperature = 1.0 if body.temperature is None else body.temperature
    if not math.isfinite(temperature) or temperature < 0:
        raise APIError(400, f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}",
                       param="temperature")
    top_p = 1.0 if body.top_p is None else body.top_p
    if not 0 < top_p <= 1:
        raise APIError(400, f"top_p must be in (0, 1] (1 = off), got {top_p}", param="top_p")
    top_k = 0 if body.top_k in (None, -1) else body.top_k
    if top_k < 0:
        raise APIError(400, f"top_k must be >= 0 (0 or -1 = off), got {top_k}", param="top_k")
    min_p = 0.0 if body.min_p is None else body.min_p
    if not 0 <= min_p <= 1:
        raise APIError(400, f"min_p must be in [0, 1] (0 = off), got {min_p}", param="min_p")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise APIError(400, f"stop strings must not be empty, got {list(stop)}", param="stop")
    stop_ids = tuple(body.stop_token_ids or ())
    if any(i < 0 for i in stop_ids):
        raise APIError(400, f"stop_token_ids must be >= 0, got {list(stop_ids)}", param="stop_token_ids")
    room = max_model_len - prompt_tokens
    if max_tokens is None:
        max_tokens = room
    if max_tokens > room or room < 1:
        raise APIError(400, f"the context is {max_model_len} tokens and this request needs "
                            f"{prompt_tokens + max(max_tokens, 1)}: {prompt_tokens} in the {prompt_param} and "
                            f"{max(max_tokens, 1)} to generate; shorten the {prompt_param} or lower max_tokens",
                       param=prompt_param, code="context_length_exceeded")
    try:
        return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              seed=secrets.randbits(64) if body.seed is None else body.seed,
                              max_tokens=max_tokens, stop=stop, stop_token_ids=stop_ids, ignore_eos=body.ignore_eos)
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc)) from None
