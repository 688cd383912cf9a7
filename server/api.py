"""The OpenAI-compatible HTTP API: /v1/models, /v1/chat/completions, /v1/completions.

A Starlette app over an EngineService (server/service.py). Requests are checked
here, field by field, so every bad one gets a 4xx with an OpenAI-style error
object ({"error": {"message", "type", "param", "code"}}) whose message says what
to change. Replies stream as server-sent events ending in `data: [DONE]`, or come
whole; both carry `usage` and an `omnidraft` object with the reply's drafting
figures (tokens per step, acceptance, speedup), which OpenAI clients ignore.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from omnidraft.core.worker.protocol import ChatRequest, TokenBatch, TurnDone
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .service import ALIAS, Busy, EngineService, Refused, Ticket

MAX_BODY_BYTES = 8 * 1024 * 1024  # far above any context the engine reads (8192 tokens)
MAX_TOKENS = 8192  # the reply-length setting's range (core/storage/settings.py)
DEFAULT_MAX_TOKENS = 2048  # when a client names none (many editors don't)
MAX_STOPS = 16
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}
ENDPOINTS = "GET /v1/models, POST /v1/chat/completions and POST /v1/completions"


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers


def error_response(error: ApiError) -> JSONResponse:
    body = {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}
    return JSONResponse(body, status_code=error.status, headers=error.headers)


# ---------------------------------------------------------------------- checking requests


def _kind(value) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a text", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _integer(body: dict, name: str, low: int, high: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer; it is {_kind(value)}.", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be from {low} to {high}; it is {value}.", name)
    return value


def _number(body: dict, name: str, low: float, high: float, default: float, above_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a number; it is {_kind(value)}.", name)
    if value > high or value < low or (above_low and value == low):
        bounds = f"above {low} and at most {high}" if above_low else f"from {low} to {high}"
        raise ApiError(400, f"'{name}' must be {bounds}; it is {value}.", name)
    return float(value)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false; it is {_kind(value)}.", name)
    return value


def _text(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a text; it is {_kind(value)}.", name)
    return value


def _stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ApiError(400, f"'stop' must be a text or a list of texts; it is {_kind(value)}.", "stop")
    if len(values) > MAX_STOPS:
        raise ApiError(400, f"'stop' may hold at most {MAX_STOPS} texts; it holds {len(values)}.", "stop")
    return tuple(v for v in values if v)


@dataclass
class Params:
    model: str | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    messages: list[dict] | None = None
    prompt: str | None = None


def _common(body: dict) -> Params:
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise ApiError(400, "'n' must be 1: this server writes one reply per request.", "n")
    max_tokens = _integer(body, "max_completion_tokens", 1, MAX_TOKENS, None)
    max_tokens = _integer(body, "max_tokens", 1, MAX_TOKENS, max_tokens)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, f"'stream_options' must be an object; it is {_kind(options)}.", "stream_options")
    seed = _integer(body, "seed", -(2**63), 2**63 - 1, None)
    return Params(
        model=_text(body, "model"),
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        temperature=_number(body, "temperature", 0.0, 2.0, 0.0),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, above_low=True),
        seed=None if seed is None else abs(seed),
        stop=_stops(body),
        stream=_flag(body, "stream"),
        include_usage=_flag(options or {}, "include_usage"),
    )


def chat_params(body: dict) -> Params:
    params = _common(body)
    messages = body.get("messages")
    if messages is None:
        raise ApiError(400, "'messages' is required: a list of {\"role\", \"content\"} objects.", "messages")
    if not isinstance(messages, list):
        raise ApiError(400, f"'messages' must be a list; it is {_kind(messages)}.", "messages")
    if not messages:
        raise ApiError(400, "'messages' is empty: send at least one message.", "messages")
    params.messages = [_message(m, i) for i, m in enumerate(messages)]
    return params


def _message(message, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"'{where}' must be an object with 'role' and 'content'; it is {_kind(message)}.", where)
    role = message.get("role")
    if role not in ROLES:
        shown = role if isinstance(role, str) else _kind(role)
        raise ApiError(400, f"'{where}.role' must be system, developer, user or assistant; it is {shown}.",
                       f"{where}.role")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):  # content parts: only text ones
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"'{where}.content' may hold only text parts "
                                    "({\"type\": \"text\", \"text\": ...}); this model reads text.",
                               f"{where}.content")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise ApiError(400, f"'{where}.content' must be a text; it is {_kind(content)}.", f"{where}.content")
    return {"role": ROLES[role], "content": content}


def completion_params(body: dict) -> Params:
    params = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise ApiError(400, "'prompt' must be one text: this server completes one prompt per request.", "prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, f"'prompt' must be a text; it is {_kind(prompt)}.", "prompt")
    if not prompt:
        raise ApiError(400, "'prompt' is empty: send the text to continue.", "prompt")
    if _flag(body, "echo"):
        raise ApiError(400, "'echo' is not supported: the reply holds only the new text.", "echo")
    if body.get("logprobs") not in (None, 0, False):
        raise ApiError(400, "'logprobs' is not supported by this server.", "logprobs")
    if body.get("best_of") not in (None, 1) or isinstance(body.get("best_of"), bool):
        raise ApiError(400, "'best_of' must be 1: this server writes one reply per request.", "best_of")
    params.prompt = prompt
    return params


# ---------------------------------------------------------------------- the app


def create_app(service: EngineService, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> Starlette:
    """The ASGI app. api_key: required as `Authorization: Bearer <key>` when set."""

    def check_key(request: Request) -> None:
        if not api_key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "This server needs an API key: send it as 'Authorization: Bearer <key>'.",
                           code="invalid_api_key", kind="authentication_error")
        if not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise ApiError(401, "The API key is not the one this server was started with.",
                           code="invalid_api_key", kind="authentication_error")

    async def read_json(request: Request) -> dict:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body_bytes:
            raise ApiError(413, f"The request body is {int(length):,} bytes; this server takes at most "
                                f"{max_body_bytes:,}.", code="request_too_large")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body_bytes:
                raise ApiError(413, f"The request body is over {max_body_bytes:,} bytes, the most this server "
                                    "takes.", code="request_too_large")
        try:
            body = json.loads(bytes(raw))
        except UnicodeDecodeError:
            raise ApiError(400, "The request body is not UTF-8 text.") from None
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"The request body is not valid JSON ({exc.msg} at line {exc.lineno}, "
                                f"column {exc.colno}).") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"The request body must be a JSON object; it is {_kind(body)}.")
        return body

    async def models(request: Request) -> JSONResponse:
        check_key(request)
        created = int(time.time())
        ids = service.model_ids()
        data = [{"id": i, "object": "model", "created": created, "owned_by": "omnidraft"} for i in ids]
        if ids and service.current is not None:
            data.append({"id": ALIAS, "object": "model", "created": created, "owned_by": "omnidraft"})
        return JSONResponse({"object": "list", "data": data})

    async def chat_completions(request: Request):
        check_key(request)
        return await serve(request, chat_params(await read_json(request)), "chat")

    async def completions(request: Request):
        check_key(request)
        return await serve(request, completion_params(await read_json(request)), "text")

    async def serve(request: Request, params: Params, kind: str):
        model_id = service.resolve(params.model)
        ticket = await service.admit(request.is_disconnected)
        try:
            if service.current is None or service.current.model_id != model_id:
                await service.switch(ticket, model_id)
            service.start_turn(ticket, ChatRequest(
                0, params.messages or [], max_new_tokens=params.max_tokens, temperature=params.temperature,
                top_p=params.top_p, seed=params.seed, prompt=params.prompt, stop=params.stop,
            ))
        finally:
            if not ticket.sent:
                service.abandon(ticket)
        reply = Reply(kind, ticket, service)
        if params.stream:
            return EventStream(reply.events(params.include_usage), on_close=lambda: service.cancel(ticket))
        return await reply.whole(request.is_disconnected)

    async def not_found(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; this server has {ENDPOINTS}."
        elif exc.status_code == 404:
            message = f"There is no {request.url.path} here; this server has {ENDPOINTS}."
        else:
            message = str(exc.detail)
        return error_response(ApiError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None))

    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return error_response(ApiError(exc.status, str(exc), code="server_busy", kind="server_error",
                                       headers={"Retry-After": str(exc.retry_after_s)}))

    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return error_response(ApiError(exc.status, str(exc), "model" if exc.status == 404 else None, exc.code))

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return error_response(ApiError(500, f"The server failed on this request ({type(exc).__name__}).",
                                       kind="server_error"))

    @asynccontextmanager
    async def lifespan(app):
        service.bind(asyncio.get_running_loop())
        yield

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: not_found, ApiError: api_error, Busy: busy, Refused: refused,
                            Exception: failed},
        lifespan=lifespan,
    )


# ---------------------------------------------------------------------- replies


class Reply:
    """One turn's answer in OpenAI's shapes (chat or text completion)."""

    def __init__(self, kind: str, ticket: Ticket, service: EngineService):
        self.kind, self.ticket, self.service = kind, ticket, service
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        current = service.current
        self.model = current.model_id if current else ALIAS
        self.learned = False

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def failure(self) -> ApiError:
        """What a turn that ended in an error answers."""
        error = self.ticket.error
        message = error.message if error else "The reply failed."
        if self.ticket.lost or error is None:
            return ApiError(503, message, kind="server_error", code="engine_unavailable")
        if error.detail:  # the engine failed on it (its traceback went to the worker's log)
            return ApiError(500, message, kind="server_error")
        return ApiError(400, message, "messages" if self.kind == "chat" else "prompt", "context_length_exceeded"
                        if "reads at most" in message or "context" in message else None)

    def usage(self, done: TurnDone) -> dict:
        stats = done.stats
        prompt = stats.prompt_tokens if stats else 0
        completion = stats.new_tokens if stats else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def figures(self, done: TurnDone) -> dict:
        """The reply's drafting figures (TurnDone's stats), and its wait for the engine."""
        stats = done.stats

        def rounded(value, digits=3):
            return None if value is None else round(value, digits)

        return {
            "method": stats.method if stats else None,
            "tokens_per_step": rounded(stats.tokens_per_step) if stats else None,
            "acceptance": rounded(stats.acceptance_rate) if stats else None,
            "speedup": rounded(stats.speedup) if stats else None,
            "tokens_per_s": rounded(stats.tokens_per_s, 2) if stats else None,
            "plain_tokens_per_s": rounded(done.baseline_tokens_per_s, 2),
            "queued_s": round(self.ticket.queued_s, 3),
            "omitted_messages": done.omitted_messages,
        }

    def whole_body(self, done: TurnDone) -> dict:
        finish = FINISH.get(done.reason, "stop")
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": done.text}, "logprobs": None,
                      "finish_reason": finish}
            body = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": finish}
            body = self._base("text_completion")
        body.update(model=done.model_id or self.model, choices=[choice], usage=self.usage(done),
                    omnidraft=self.figures(done))
        return body

    async def whole(self, is_disconnected: Callable) -> JSONResponse:
        ticket = self.ticket
        while ticket.done is None:
            try:
                await asyncio.wait_for(ticket.events.get(), 0.5)
            except TimeoutError:
                if await is_disconnected():
                    self.service.cancel(ticket)
                    raise ApiError(499, "The client went away.") from None
        if ticket.done.reason == "error":
            raise self.failure()
        return JSONResponse(self.whole_body(ticket.done))

    def _chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice]}

    async def events(self, include_usage: bool) -> AsyncIterator[str]:
        if self.kind == "chat":
            yield _sse(self._chunk(None, None, first=True))
        while True:
            event = await self.ticket.events.get()
            if isinstance(event, TokenBatch):
                text = "".join(piece for piece, _ in event.pieces)
                if text:
                    yield _sse(self._chunk(text, None))
            elif isinstance(event, TurnDone) and event.request_id == self.ticket.request_id:
                if event.reason == "error":
                    error = self.failure()
                    yield _sse({"error": {"message": error.message, "type": error.kind, "param": error.param,
                                          "code": error.code}})
                else:
                    last = self._chunk(None, FINISH.get(event.reason, "stop"))
                    last["omnidraft"] = self.figures(event)
                    yield _sse(last)
                    if include_usage:
                        yield _sse({**self._base(last["object"]), "choices": [], "usage": self.usage(event),
                                    "omnidraft": self.figures(event)})
                yield "data: [DONE]\n\n"
                return


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class EventStream(StreamingResponse):
    """Server-sent events that notice a client going away at once (not only at the
    next write), so its turn is cancelled (on_close) within one decoding step."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away mid-write
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self.on_close()  # a finished turn ignores it
