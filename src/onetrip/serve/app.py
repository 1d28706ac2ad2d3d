"""The OpenAI-compatible HTTP API over an ``EngineRunner`` (FastAPI).

    app = create_app(runner, "llama-3.2-1b-instruct")
    uvicorn.run(app, host="127.0.0.1", port=8000)

Endpoints:
    POST /v1/chat/completions   messages through the model's chat template
    POST /v1/completions        prompt: a string, a list of one string, token ids, or a list of one list of ids
    GET  /v1/models             the one served model
    GET  /health                200 while the engine thread runs, else 503

Both POSTs answer one JSON object, or with ``"stream": true`` server-sent events
(``data: {chunk}\\n\\n`` ... ``data: [DONE]\\n\\n``; ``stream_options.include_usage`` adds a
last chunk with the usage and no choices). Errors are OpenAI-shaped,
``{"error": {"message", "type", "param", "code"}}``: 400 for a bad value, a wrong type or
malformed JSON, 404 for another model name, 400 with code ``context_length_exceeded`` when
prompt + max_tokens exceeds the context, 503 while shutting down, 500 when a step fails.
A client that disconnects (streaming or not) has its request aborted at once, which
frees its KV pages.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator, Optional

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from .protocol import APIError, ChatBody, CompletionBody, chat_messages, error_body, sampling_params, unsupported
from .runner import Delta, EngineRunner, EngineStopped

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat runs to the context's end


def create_app(runner: EngineRunner, served_model_name: str) -> FastAPI:
    """The FastAPI app serving ``runner`` (already started) as model ``served_model_name``."""
    app = FastAPI(title="onetrip", docs_url=None, redoc_url=None)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_body(exc), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:  # logged by Starlette too
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"),
                            status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({}, status_code=200 if runner.alive else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": created,
                                            "owned_by": "onetrip", "max_model_len": runner.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        _check_model(body.model, served_model_name)
        unsupported(body)
        prompt_ids = _completion_prompt(body.prompt, runner)
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return await _serve(request, runner, body, prompt_ids, max_tokens, served_model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        _check_model(body.model, served_model_name)
        unsupported(body)
        if runner.tokenizer is None:
            raise APIError(400, "this model has no tokenizer, so it cannot chat; use /v1/completions with token "
                                "ids as the prompt", param="messages")
        messages = chat_messages(body)
        try:
            prompt_ids = runner.tokenizer.encode_chat(messages)
        except (ValueError, TypeError, jinja2.TemplateError) as exc:  # no template, or it refused the chat
            raise APIError(400, f"the chat template failed: {exc}", param="messages") from None
        max_tokens = body.max_tokens if body.max_completion_tokens is None else body.max_completion_tokens
        return await _serve(request, runner, body, prompt_ids, max_tokens, served_model_name, chat=True)

    return app


# ---- requests -------------------------------------------------------------------------------------

def _check_model(name: str, served: str) -> None:
    if name != served:
        raise APIError(404, f"model {name!r} is not served here; this server serves {served!r} (GET /v1/models)",
                       param="model", code="model_not_found")


def _completion_prompt(prompt, runner: EngineRunner) -> list[int]:
    """Token ids of a completions prompt: a string (encoded, special tokens added), a list of
    one string, a list of ids, or a list of one list of ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise APIError(400, f"prompt holds {len(prompt)} prompts; this server takes one per request",
                       param="prompt")
    if isinstance(prompt, str):
        if runner.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: give the prompt as token ids", param="prompt")
        prompt = runner.tokenizer.encode(prompt)
    if not prompt:
        raise APIError(400, "prompt is empty; give at least one token", param="prompt")
    bad = [t for t in prompt if not 0 <= t < runner.vocab_size]
    if bad:
        raise APIError(400, f"prompt token ids must be in [0, {runner.vocab_size}), got {bad[:8]}", param="prompt")
    return prompt


async def _serve(request: Request, runner: EngineRunner, body, prompt_ids: list[int], max_tokens: Optional[int],
                 model: str, chat: bool):
    """Check the sampling values, hand the request to the engine, answer (stream or not)."""
    prompt_param = "messages" if chat else "prompt"
    if runner.tokenizer is None and body.stop:
        raise APIError(400, "stop strings need a tokenizer, which this model lacks; use stop_token_ids",
                       param="stop")
    params = sampling_params(body, max_tokens, len(prompt_ids), runner.max_model_len, prompt_param)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        events = runner.add(request_id, prompt_ids, params)
    except EngineStopped as exc:
        raise APIError(503, str(exc), type="server_error") from None
    try:
        accepted = await events.get()
    except BaseException:  # cancelled while queued
        runner.abort(request_id)
        raise
    if isinstance(accepted, (ValueError, TypeError)):  # the scheduler refused it
        raise APIError(400, str(accepted), param=prompt_param)
    if isinstance(accepted, BaseException):
        raise _engine_error(accepted)
    answer = _Answer(request_id, chat, model, prompt_ids, body.return_token_ids or runner.tokenizer is None)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_stream(runner, events, answer, usage), media_type="text/event-stream")
    return await _collect(request, runner, events, answer)


class _Answer:
    """The response's fixed fields and the chunk and body builders of one request."""

    def __init__(self, request_id: str, chat: bool, model: str, prompt_ids: list[int], token_ids: bool):
        self.id, self.chat, self.model, self.prompt_ids = request_id, chat, model, prompt_ids
        self.kind = "chat.completion" if chat else "text_completion"
        self.chunk_kind = "chat.completion.chunk" if chat else "text_completion"
        self.token_ids = token_ids  # add prompt_token_ids / token_ids to the choice
        self.created = int(time.time())

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def body(self, text: str, ids: list[int], reason: Optional[str], usage: dict) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.token_ids:
            choice.update(prompt_token_ids=self.prompt_ids, token_ids=ids)
        return {**self._head(self.kind), "choices": [choice], "usage": usage}

    def chunk(self, text: Optional[str], ids: list[int], reason: Optional[str], usage: bool, first: bool) -> str:
        choice = {"index": 0, "logprobs": None, "finish_reason": reason}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        if self.token_ids:
            choice["token_ids"] = ids
        data = {**self._head(self.chunk_kind), "choices": [choice]}
        if usage:
            data["usage"] = None
        return _sse(data)

    def usage_chunk(self, usage: dict) -> str:
        return _sse({**self._head(self.chunk_kind), "choices": [], "usage": usage})


def _usage(delta: Delta) -> dict:
    return {"prompt_tokens": delta.prompt_tokens, "completion_tokens": delta.completion_tokens,
            "total_tokens": delta.prompt_tokens + delta.completion_tokens}


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _engine_error(exc: BaseException) -> APIError:
    if isinstance(exc, EngineStopped):
        return APIError(503, str(exc), type="server_error")
    return APIError(500, f"the engine failed: {type(exc).__name__}: {exc}", type="server_error")


async def _stream(runner: EngineRunner, events: asyncio.Queue, answer: _Answer, usage: bool) -> AsyncIterator[str]:
    """Server-sent events of one request. Starlette cancels this generator when the client
    disconnects; ``finally`` then aborts the request."""
    finished = False
    try:
        if answer.chat:  # the assistant's role comes first, before any token
            yield answer.chunk("", [], None, usage, first=True)
        while not finished:
            delta = await events.get()
            if isinstance(delta, BaseException):
                finished = True
                yield _sse(_engine_error(delta).body())
                break
            finished = delta.finished
            if delta.text or delta.finished or (answer.token_ids and delta.token_ids):
                yield answer.chunk(delta.text, delta.token_ids, delta.finish_reason, usage, first=False)
        if usage and not isinstance(delta, BaseException):
            yield answer.usage_chunk(_usage(delta))
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            runner.abort(answer.id)


_GONE = object()  # in a request's queue: its client disconnected


async def _collect(request: Request, runner: EngineRunner, events: asyncio.Queue, answer: _Answer) -> JSONResponse:
    """Wait for the whole answer; abort the request if the client disconnects first."""
    gone = asyncio.ensure_future(_disconnect(request))
    # the disconnect arrives through the same queue as the deltas: no task a delta
    gone.add_done_callback(lambda t: None if t.cancelled() else events.put_nowait(_GONE))
    text, ids, finished = [], [], False
    try:
        while not finished:
            delta = await events.get()
            if delta is _GONE:  # nobody to answer; ``finally`` aborts
                raise APIError(499, "the client disconnected")
            if isinstance(delta, BaseException):
                finished = True
                raise _engine_error(delta)
            finished = delta.finished
            text.append(delta.text or "")
            ids += delta.token_ids
    finally:
        gone.cancel()
        if not finished:
            runner.abort(answer.id)
    return JSONResponse(answer.body("".join(text), ids, delta.finish_reason, _usage(delta)))


async def _disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body is read already, so the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _validation_body(exc: RequestValidationError) -> dict:
    """FastAPI's 422 as an OpenAI 400: the first errors' paths and messages; param is the
    top-level field of the first, code its pydantic error type."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return error_body(f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})",
                          code="invalid_json")
    paths = [".".join(str(p) for p in e.get("loc", ()) if p != "body") for e in errors]
    message = "; ".join(f"{path or 'body'}: {e.get('msg')}" for path, e in zip(paths[:4], errors))
    param = paths[0].split(".")[0] if paths and paths[0] else None
    return error_body(f"invalid request: {message}", param=param, code=first.get("type"))
