"""An OpenAI-compatible HTTP endpoint on `rlx rollout-serve` that records episodes for training.

Routes: ``POST /v1/chat/completions`` (non-streaming), ``GET /v1/models`` and
``POST /v1/episodes/{id}/finish`` (``{"reward": r}``). It is served by starlette on uvicorn (what
vLLM's own OpenAI server runs on; both come with vLLM), in the rollout server's event loop: a
completion becomes one ``protocol.Generate`` of token ids answered by ``RolloutServer.answer``, the
path every ZeroMQ request takes, so it shares the backend, its batching, pauses and weight updates.

Prompts come from the tokenizer's chat template (with ``tools``), or the message contents
concatenated when the tokenizer has none; ``rlx.prompt_format`` in the response says which.
A request carrying an episode id (header ``X-Episode-Id``, else the ``user`` field) is recorded:
prompt ids, sampled ids and their logprobs. A follow-up request that repeats the conversation plus
the model's answer gets the model's own tokens as its prefix (``ChatFormat.continuation``), so a
multi-request conversation is one token-in/token-out episode. Finishing it with a reward queues it
for the trainer, which takes it with ``protocol.TakeEpisodes`` (``rlx.orchestrator.external``).

A request body is read up to ``rollout.openai_max_body_mb`` (HTTP 413 past it), and prompts are rendered
and tokenized in a worker thread, so one huge message stalls neither HTTP nor ZeroMQ.

Groups (GRPO needs ``rollout.n`` samples of one state): the first request of episode ``E`` with ``n`` > 1
samples ``n`` answers at once and opens the episodes ``E.0`` .. ``E.n-1`` (``rlx.episode_ids`` in the
response), each going on with its own follow-ups and finish, all in group ``E``; or each episode's first
request names its group in the header ``X-Group-Id``. The trainer takes whole groups.

Binding: loopback unless ``rollout.openai_host`` names another interface, which needs
``rollout.auth_token``; with a token set, every request must send ``Authorization: Bearer TOKEN``.
Left out: streaming, the legacy ``/v1/completions`` route, tool-call parsing of the answer, ``n`` > 1 in the
middle of an episode (branching).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import math
import socket
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import msgspec

from rlx.formats.chat import ChatFormat
from rlx.net import is_loopback_host
from rlx.rollout import protocol as p
from rlx.trace import tracer

log = logging.getLogger("rlx.rollout.openai_http")

DEFAULT_MAX_BODY_MB = 4.0
"""Largest request body read by default (``rollout.openai_max_body_mb``)."""
MAX_EPISODES = 10_000
"""Most episodes held at once (open + finished but not yet taken by the trainer)."""
MAX_TURNS = 1024
"""Most requests one episode may record (a client that sets ``user`` on every request would grow one forever)."""
HTTP_REQUEST_IDS = 1 << 48
"""Request ids of HTTP completions start here, apart from a ZeroMQ client's."""


class ChatRequest(msgspec.Struct):
    """The fields of an OpenAI chat-completion request rlx reads; others (tool_choice, ...) are ignored."""

    messages: list[dict]
    model: str = ""
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    tools: list[dict] | None = None
    logprobs: bool = False
    user: str | None = None
    stream: bool = False


class Finish(msgspec.Struct):
    reward: float


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _OpenEpisode:
    group: str = ""
    """The group the episode belongs to ('' = none)."""
    turns: list[p.EpisodeTurn] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    """The last request's messages, which a follow-up repeats."""
    text: str = ""
    """The model's last answer, decoded."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One request of an episode at a time: each builds on the one before."""


class EpisodeStore:
    """Open episodes by id, and finished ones queued (oldest first) until the trainer takes them."""

    def __init__(self, max_episodes: int = MAX_EPISODES) -> None:
        self.max_episodes = max_episodes
        self.open: dict[str, _OpenEpisode] = {}
        self.finished: deque[p.RecordedEpisode] = deque()

    def get_or_open(self, episode_id: str, group: str = "") -> _OpenEpisode:
        if episode_id not in self.open:
            self.check_room(1)
            self.open[episode_id] = _OpenEpisode(group)
        return self.open[episode_id]

    def check_room(self, count: int) -> None:
        if len(self.open) + len(self.finished) + count > self.max_episodes:
            raise HttpError(
                429,
                f"{self.max_episodes} episodes are open or waiting for the trainer; finish "
                "open ones (POST /v1/episodes/ID/finish) or let the trainer take some",
            )

    def finish(self, episode_id: str, reward: float) -> p.RecordedEpisode:
        episode = self.open.get(episode_id)
        if episode is None or not episode.turns:
            raise HttpError(
                404,
                f"no open episode {episode_id!r}; an episode opens with a /v1/chat/completions "
                "request carrying its id (X-Episode-Id header or the user field), and finishes once",
            )
        del self.open[episode_id]
        recorded = p.RecordedEpisode(id=episode_id, turns=episode.turns, reward=reward, group=episode.group)
        self.finished.append(recorded)
        return recorded

    def take(self, max_episodes: int, group_size: int = 1) -> list[p.RecordedEpisode]:
        """Up to ``max_episodes`` finished episodes, oldest first; with ``group_size`` > 1 whole groups only."""
        if group_size <= 1:
            count = min(max(max_episodes, 0), len(self.finished))
            return [self.finished.popleft() for _ in range(count)]
        members: dict[str, list[p.RecordedEpisode]] = {}
        taken: list[p.RecordedEpisode] = []
        for episode in self.finished:
            group = members.setdefault(episode.group, []) if episode.group else []
            group.append(episode)
            if len(group) == group_size and len(taken) + group_size <= max_episodes:
                taken += group
                members[episode.group] = []  # more finished episodes of this group start another one
        chosen = {id(e) for e in taken}
        self.finished = deque(e for e in self.finished if id(e) not in chosen)
        return taken


class OpenAIEndpoint:
    def __init__(
        self, server, tokenizer, defaults: p.SamplingSpec, model_name: str, max_body_mb: float = DEFAULT_MAX_BODY_MB
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, "auto", where="the OpenAI endpoint")
        self.defaults = defaults
        self.model_name = model_name
        self.max_body_mb = max_body_mb
        self.episodes = EpisodeStore()
        self._ids = itertools.count(HTTP_REQUEST_IDS)

    def app(self):
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._endpoint(self.chat_completion), methods=["POST"]),
                Route("/v1/models", self._endpoint(self.models), methods=["GET"]),
                Route("/v1/episodes/{episode_id}/finish", self._endpoint(self.finish), methods=["POST"]),
            ]
        )

    def _endpoint(self, handler):
        """``handler(request) -> dict`` as a starlette endpoint: bearer check, JSON in and out, errors shaped
        like OpenAI's (``{"error": {"message", "type"}}``)."""
        from starlette.requests import ClientDisconnect
        from starlette.responses import Response

        async def endpoint(request):
            try:
                self._check_auth(request.headers.get("authorization", ""))
                status, body = 200, await handler(request)
            except HttpError as exc:
                status, body = exc.status, _error(exc.status, str(exc))
            except ClientDisconnect:  # nobody is left to answer: one line, no traceback
                client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
                log.warning(
                    "%s hung up before sending the whole body of %s %s; the request was dropped",
                    client,
                    request.method,
                    request.url.path,
                )
                return Response(status_code=400)
            return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")

        return endpoint

    def _check_auth(self, header: str) -> None:
        token = self.server.token
        if token and not hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
            raise HttpError(
                401,
                "bad or missing auth token; send the header 'Authorization: Bearer TOKEN' with "
                "the server's rollout.auth_token",
            )

    async def models(self, request) -> dict:
        return {
            "object": "list",
            "data": [
                {"id": self.model_name, "object": "model", "created": int(self.server.started), "owned_by": "rlx"}
            ],
        }

    async def _body(self, request, kind):
        """The request's JSON body as ``kind``, read only up to ``max_body_mb``: a larger one is a 413, whether
        its Content-Length says so or its stream (chunked) runs past the limit."""
        limit = int(self.max_body_mb * 2**20)
        too_large = HttpError(
            413,
            f"the request body is larger than rollout.openai_max_body_mb={self.max_body_mb:g} "
            "MiB; send a shorter conversation, or raise rollout.openai_max_body_mb on the "
            "rollout server",
        )
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return _decode(b"".join(chunks), kind)

    async def finish(self, request) -> dict:
        body = await self._body(request, Finish)
        if not math.isfinite(body.reward):
            raise HttpError(400, f"reward={body.reward} is not a finite number; send a float")
        recorded = self.episodes.finish(request.path_params["episode_id"], body.reward)
        tracer.event("episode.finish", episode_id=recorded.id, turns=len(recorded.turns), reward=body.reward)
        return {
            "id": recorded.id,
            "object": "episode",
            "turns": len(recorded.turns),
            "reward": body.reward,
            "waiting_for_trainer": len(self.episodes.finished),
        }

    async def chat_completion(self, request) -> dict:
        body = await self._body(request, ChatRequest)
        if body.stream:
            raise HttpError(400, "stream=true is not supported; send stream=false")
        if not body.messages:
            raise HttpError(400, "messages is empty; send at least one {role, content} message")
        episode_id = request.headers.get("x-episode-id") or body.user or ""
        group = request.headers.get("x-group-id", "")
        if not episode_id:
            response = await self._complete(body, await self._prompt_ids(body, _OpenEpisode()), "")
            response.pop("_samples")
            return response
        if body.n != 1:
            return await self._fork(body, episode_id, group or episode_id)
        episode = self.episodes.get_or_open(episode_id, group)
        async with episode.lock:
            if len(episode.turns) >= MAX_TURNS:
                raise HttpError(
                    400,
                    f"episode {episode_id!r} already has {MAX_TURNS} turns; finish it (POST "
                    f"/v1/episodes/{episode_id}/finish) or use a new episode id",
                )
            try:
                prompt_ids = await self._prompt_ids(body, episode)
                response = await self._complete(body, prompt_ids, episode_id)
            except HttpError:
                if not episode.turns:  # nothing recorded: a failed first request opens no episode
                    self.episodes.open.pop(episode_id, None)
                raise
            if self.episodes.open.get(episode_id) is episode:  # not finished while this request ran
                self._record(episode, body, prompt_ids, response["_samples"][0])
        response.pop("_samples", None)
        return response

    def _record(self, episode: _OpenEpisode, body: ChatRequest, prompt_ids: list[int], sample: p.Sample) -> None:
        episode.turns.append(
            p.EpisodeTurn(
                prompt_ids, sample.token_ids, sample.logprobs, self.server.weight_version, list(sample.versions)
            )
        )
        episode.messages, episode.text = list(body.messages), sample.text

    async def _fork(self, body: ChatRequest, episode_id: str, group: str) -> dict:
        """``n`` answers to the first request of ``episode_id``: the episodes ``episode_id.i`` of one group."""
        ids = [f"{episode_id}.{i}" for i in range(body.n)]
        if body.n < 1 or any(i in self.episodes.open for i in [episode_id, *ids]):
            raise HttpError(
                400,
                f"n={body.n} in episode {episode_id!r}: n > 1 starts the episodes {episode_id}.0.."
                f"{episode_id}.{body.n - 1} and is allowed on a new episode id only; send n=1 to go "
                "on with one of them (X-Episode-Id: ID.i)",
            )
        self.episodes.check_room(body.n)
        prompt_ids = await self._prompt_ids(body, _OpenEpisode())
        response = await self._complete(body, prompt_ids, episode_id)
        for i, sample in zip(ids, response.pop("_samples"), strict=True):
            self._record(self.episodes.get_or_open(i, group), body, prompt_ids, sample)
        response["rlx"]["episode_ids"] = ids
        return response

    async def _prompt_ids(self, body: ChatRequest, episode: _OpenEpisode) -> list[int]:
        """Token-in/token-out: a follow-up starts with the episode's own tokens; else the rendered messages.
        Rendered and tokenized in a worker thread: a long conversation takes seconds, during which the event
        loop goes on serving HTTP and ZeroMQ (the tokenizer releases the GIL)."""
        return await asyncio.to_thread(self._prompt_ids_now, body, episode)

    def _prompt_ids_now(self, body: ChatRequest, episode: _OpenEpisode) -> list[int]:
        if episode.turns:
            last = episode.turns[-1]
            added = self._rendered(
                lambda: self.chat.continuation(
                    episode.messages, body.messages, episode.text, last.token_ids, body.tools
                )
            )
            if added is not None:
                return last.prompt_token_ids + last.token_ids + added
        return self._rendered(lambda: self.chat.prompt_ids(body.messages, body.tools))

    @staticmethod
    def _rendered(render):
        """``render()``, with a template that cannot render the messages as a 400 naming why."""
        import jinja2

        try:
            return render()
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise HttpError(400, f"the chat template cannot render these messages: {exc}") from None

    async def _complete(self, body: ChatRequest, prompt_ids: list[int], episode_id: str) -> dict:
        sampling = self._sampling(body)
        request = p.Request(
            id=next(self._ids),
            body=p.Generate(prompt_token_ids=[prompt_ids], sampling=sampling),
            deadline=time.time() + self.server.request_timeout_s,
            token=self.server.token,
        )
        reply = await self.server.answer(request)
        if not reply.ok:
            raise HttpError(503 if self.server.death else 400, reply.error)
        result = reply.body.results[0]
        choices = [self._choice(i, sample, body.logprobs) for i, sample in enumerate(result.samples)]
        completion_tokens = sum(len(s.token_ids) for s in result.samples)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model or self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
            "rlx": {
                "episode_id": episode_id or None,
                "prompt_format": self.chat.kind,
                "weight_version": self.server.weight_version,
                "prompt_token_ids": prompt_ids,
                "completion_token_ids": [s.token_ids for s in result.samples],
            },
            "_samples": result.samples,
        }

    def _sampling(self, body: ChatRequest) -> p.SamplingSpec:
        d = self.defaults
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        max_tokens = next((v for v in (body.max_completion_tokens, body.max_tokens) if v is not None), d.max_tokens)
        return p.SamplingSpec(
            n=body.n,
            temperature=d.temperature if body.temperature is None else body.temperature,
            top_p=d.top_p if body.top_p is None else body.top_p,
            top_k=d.top_k,
            max_tokens=max_tokens,
            stop=stop,
            seed=body.seed,
        )

    def _choice(self, index: int, sample: p.Sample, with_logprobs: bool) -> dict:
        choice = {
            "index": index,
            "message": {"role": "assistant", "content": sample.text},
            "finish_reason": sample.finish_reason or "stop",
            "logprobs": None,
        }
        if with_logprobs:
            choice["logprobs"] = {
                "content": [
                    {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(sample.token_ids, sample.logprobs, strict=True)
                ]
            }
        return choice


def _decode(data: bytes, kind):
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HttpError(400, f"bad request body: {exc}") from None


def _error(status: int, message: str) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "code": status}}


def check_http_bind(host: str, token: str) -> None:
    """A non-loopback interface needs the auth token; raises ValueError naming the fix."""
    if not is_loopback_host(host) and not token:
        raise ValueError(
            f"binding the OpenAI endpoint to {host} needs an auth token (clients send it as "
            "'Authorization: Bearer TOKEN'); set rollout.auth_token or export it in "
            "RLX_ROLLOUT_AUTH_TOKEN, or bind rollout.openai_host=127.0.0.1"
        )


def listen_socket(host: str, port: int) -> socket.socket:
    """The endpoint's listening socket, bound before the model loads so a taken port (or a missing
    library) fails at once."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ValueError("the OpenAI endpoint needs starlette and uvicorn: pip install 'rlx[openai]'") from None
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise ValueError(
            f"cannot listen on {host}:{port} for the OpenAI endpoint ({exc.strerror}); pick another "
            "--openai-port / rollout.openai_port"
        ) from None


def _uvicorn_server(app):
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the rollout server owns SIGTERM/SIGINT and stops this server itself
            yield

    return Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))


def openai_url(host: str, port: int) -> str:
    """The base URL an OpenAI client is given (``base_url``) for an endpoint bound to ``host:port``."""
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


async def run_with_openai(
    backend,
    address: str,
    token: str,
    sock: socket.socket,
    model_name: str,
    defaults: p.SamplingSpec,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    **limits,
) -> None:
    """``rlx.rollout.server.run_server`` plus the HTTP endpoint on ``sock``, in one event loop."""
    from transformers import AutoTokenizer

    from rlx.rollout.server import RolloutServer

    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, backend.model_path)
    with tracer.span("rollout.start", backend=backend.name):
        await backend.start()
    server = RolloutServer(backend, address, token, **limits)
    endpoint = OpenAIEndpoint(server, tokenizer, defaults, model_name, max_body_mb)
    server.episodes = endpoint.episodes
    http = _uvicorn_server(endpoint.app())
    http_task = asyncio.create_task(http.serve(sockets=[sock]))
    host, port = sock.getsockname()[:2]
    logging.getLogger("rlx.rollout.server").info(
        "OpenAI-compatible endpoint at %s (POST /chat/completions; an X-Episode-Id header records an episode, "
        "POST /episodes/ID/finish gives its reward)",
        openai_url(host, port),
    )
    try:
        await server.serve()
    finally:
        http.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(http_task, 5.0)
        sock.close()
