"""Wire protocol between rollout clients and `rlx rollout-serve`: msgspec structs over msgpack.

Every message is an envelope (``Request`` / ``Reply``) carrying the protocol version, a
request id, an absolute deadline and the auth token; the body is a tagged union, so a
decoder accepts only the structs listed here. Nothing is ever pickled. A weight update is one
body, ``UpdateWeights``, carrying an ``rlx.sync.messages`` request as its own bytes: the sync
channel (``rlx.sync.channel.RpcSyncChannel``) and the server pass it on untouched and the backend's
``rlx.sync.receiver.SyncHandler`` decodes and answers it (``AckResult``).
"""

from __future__ import annotations

import math

import msgspec

from rlx.config.checks import MIN_TEMPERATURE
from rlx.config.rollout import SamplingConfig
from rlx.sync.messages import BucketAck

PROTOCOL_VERSION = 1

SERVER_STOPPING = (
    "the rollout server is stopping (SIGTERM, SIGINT or a Shutdown request) and cancelled this request "
    "unfinished; send it again to a live server"
)
"""The error of every request a stopping server cancels; a client that restarts servers re-issues such a request."""


class SamplingSpec(msgspec.Struct, frozen=True):
    """Sampling parameters of one generate request (vLLM's names and meanings)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] = []
    seed: int | None = None

    @classmethod
    def of(cls, sampling: SamplingConfig, **changes) -> SamplingSpec:
        """The run's sampling (``cfg.sampling``) as a request's, with ``changes`` (e.g. ``n=1``, ``seed=...``)."""
        return cls(**{**sampling.as_dict(), **changes})


class Generate(msgspec.Struct, tag="generate"):
    """Generate ``sampling.n`` completions for each prompt (text or token ids)."""

    prompts: list[str] = []
    prompt_token_ids: list[list[int]] = []
    sampling: SamplingSpec = SamplingSpec()
    together: int = 0
    """Prompts sent to this server at once with these, these included (0: not said): a backend that batches
    (hf) waits for that many before it starts a call, instead of for a pause in their arrival."""


class Pause(msgspec.Struct, tag="pause"):
    """Stop scheduling; in-flight requests are kept (not aborted) until ``Resume``."""


class Resume(msgspec.Struct, tag="resume"):
    """Schedule again. ``weight_version`` >= 0 (sent after a weight sync) names the policy version the
    weights now hold: Health reports it and the tokens generated from here on carry it."""

    weight_version: int = -1


class Health(msgspec.Struct, tag="health"):
    pass


class Stats(msgspec.Struct, tag="stats"):
    pass


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


class Sleep(msgspec.Struct, tag="sleep"):
    """Free the accelerator for the trainer (colocated placement): stop scheduling, then ``level`` 1 moves the
    weights to CPU and frees the KV cache, 2 frees both (the next sync brings the weights). Answered with
    ``MemoryResult``."""

    level: int = 1


class WakeUp(msgspec.Struct, tag="wake_up"):
    """Take back what ``Sleep`` freed: ``tags`` ``["weights"]`` before a sync, then ``["kv_cache"]`` to generate
    again; empty = everything. Scheduling resumes once nothing sleeps. Answered with ``MemoryResult``."""

    tags: list[str] = []


class UpdateWeights(msgspec.Struct, tag="update_weights"):
    """One weight-sync request (begin, bucket, end, ...), msgpack-encoded by ``rlx.sync.messages``;
    answered with an ``AckResult``."""

    payload: bytes


class TakeEpisodes(msgspec.Struct, tag="take_episodes"):
    """Hand over (and forget) up to ``max_episodes`` episodes an external agent finished on the
    server's OpenAI endpoint (``rlx.rollout.openai_http``), oldest first; answered with ``EpisodesResult``.
    With ``group_size`` > 1 only whole groups are handed over: ``group_size`` finished episodes of one group,
    the groups in the order their last episode finished."""

    max_episodes: int = 1
    group_size: int = 1


class ScoreTokens(msgspec.Struct, tag="score_tokens"):
    """Log-probabilities under the served model (temperature 1) of given token sequences, e.g. a distillation
    teacher scoring a student's samples: for sequence i, every token from ``start[i]`` on, given the ones before
    it. Answered with ``ScoreResult``."""

    token_ids: list[list[int]]
    start: list[int]


RequestBody = (
    Generate | Pause | Resume | Health | Stats | Shutdown | UpdateWeights | Sleep | WakeUp | TakeEpisodes | ScoreTokens
)


class Request(msgspec.Struct):
    id: int
    body: RequestBody
    deadline: float = 0.0
    """Absolute wall-clock time (time.time()) after which the client no longer waits; 0 = none."""
    token: str = ""
    version: int = PROTOCOL_VERSION


class Sample(msgspec.Struct):
    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled token under the engine's sampling distribution."""
    text: str
    finish_reason: str
    versions: list[int] = []
    """Weight version that sampled each token (one per token id); a request in flight across a weight
    update has tokens of two or more versions. Empty from a backend that does not record them."""
    routes: bytes = b""
    """MoE models with routes recorded (``RolloutRole.record_routes``): the experts each layer routed every
    prompt and completion token to but the last, ``routes_shape`` [tokens, MoE layers, top_k] integers of
    ``routes_dtype`` (numpy's ``|u1`` or ``<i2``), row-major. Empty when not recorded."""
    routes_shape: list[int] = []
    routes_dtype: str = ""


class PromptResult(msgspec.Struct):
    prompt_token_ids: list[int]
    samples: list[Sample]
    queued_s: float = 0.0
    generate_s: float = 0.0


class GenerateResult(msgspec.Struct, tag="generate_result"):
    results: list[PromptResult]


class Ok(msgspec.Struct, tag="ok"):
    pass


class HealthResult(msgspec.Struct, tag="health_result"):
    backend: str
    model: str
    paused: bool
    weight_version: int
    startup: dict[str, float] = msgspec.field(default_factory=dict)
    """Where the server's start-up went (``rlx.trace.startup.marks``): ``started`` (its process), and the ends of
    ``imported`` and ``command`` (a standby's imports, and its wait for the command line), ``engine_start`` and
    ``engine_ready``, as seconds since the epoch."""


class StatsResult(msgspec.Struct, tag="stats_result"):
    in_flight: int
    completed: int
    generated_tokens: int
    paused: bool
    weight_version: int
    uptime_s: float


class MemoryResult(msgspec.Struct, tag="memory_result"):
    """The backend after a Sleep or WakeUp: what still sleeps, and its accelerator memory in GiB."""

    asleep: list[str]
    memory_gb: float = 0.0
    """Accelerator memory the engine holds now (0 on a CPU-only host)."""
    peak_memory_gb: float = 0.0
    """Its high-water mark since the previous Sleep or WakeUp: the phase that just ended."""


class AckResult(msgspec.Struct, tag="ack_result"):
    ack: BucketAck


class EpisodeTurn(msgspec.Struct):
    """One model call of an episode, token-in/token-out: the prompt as the engine saw it and what it sampled."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    weight_version: int = 0
    """The server's weight version when the call was answered."""
    versions: list[int] = []
    """The weight version that sampled each token (empty from a backend that does not record them)."""


class RecordedEpisode(msgspec.Struct):
    id: str
    turns: list[EpisodeTurn]
    reward: float
    group: str = ""
    """The group the episode belongs to: the id of the request that asked for ``n`` samples, or the
    ``X-Group-Id`` header; '' = none."""


class EpisodesResult(msgspec.Struct, tag="episodes_result"):
    episodes: list[RecordedEpisode]


class ScoreResult(msgspec.Struct, tag="score_result"):
    logprobs: list[list[float]]
    """Per sequence, the logprob of each token from its ``start`` on."""


ReplyBody = GenerateResult | Ok | HealthResult | StatsResult | AckResult | MemoryResult | EpisodesResult | ScoreResult


class Reply(msgspec.Struct):
    id: int
    ok: bool
    body: ReplyBody | None = None
    error: str = ""
    version: int = PROTOCOL_VERSION


class _RequestId(msgspec.Struct):
    """The id alone of a request that failed to decode, so its error reply still reaches its caller."""

    id: int


MAX_N = 1024
"""Most samples per prompt one request may ask for."""
MAX_STOP_STRINGS = 64
"""Most stop strings one request may carry."""

_request_decoder = msgspec.msgpack.Decoder(Request)
_request_id_decoder = msgspec.msgpack.Decoder(_RequestId)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()


class MalformedRequest(ValueError):
    """Bytes that are not a valid ``Request``; ``request_id`` is its id when that much could be read, else -1."""

    def __init__(self, message: str, request_id: int = -1) -> None:
        super().__init__(message)
        self.request_id = request_id


def encode(message: Request | Reply) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes) -> Request:
    """Raises ``MalformedRequest`` on anything but a valid Request, fast: a nesting deeper than the
    interpreter's recursion limit fails with ``RecursionError`` inside msgspec, caught here."""
    try:
        return _request_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise MalformedRequest(
            f"malformed request: {reason}; send an msgpack-encoded rlx.rollout.protocol.Request", request_id(data)
        ) from None


def request_id(data: bytes) -> int:
    """The id of the request in ``data`` without decoding the rest, or -1 when not even that can be read."""
    try:
        return _request_id_decoder.decode(data).id
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return -1


def generate_problem(body: Generate, max_model_len: int, vocab_size: int = 0) -> str:
    """Why the server refuses ``body`` (naming the field and its allowed range), or "" when it is
    acceptable. Prompt lengths are checked per prompt by the server, which knows the tokenizer; token ids
    against ``vocab_size`` when it is known (> 0)."""
    if body.prompts and body.prompt_token_ids:
        return "a generate request sets both prompts and prompt_token_ids; send one of them"
    if not (body.prompts or body.prompt_token_ids):
        return "generate request has no prompts; set prompts or prompt_token_ids"
    if any(not ids for ids in body.prompt_token_ids):
        return "prompt_token_ids holds an empty prompt; every prompt needs at least one token"
    problem = token_id_problem("prompt_token_ids", body.prompt_token_ids, vocab_size)
    return problem or sampling_problem(body.sampling, max_model_len)


def token_id_problem(field: str, sequences, vocab_size: int) -> str:
    """The first token id of ``sequences`` that no model row has (negative, or >= ``vocab_size`` when known)."""
    for i, ids in enumerate(sequences):
        if ids and min(ids) < 0:
            return f"{field}[{i}] holds a negative token id; token ids are >= 0"
        if ids and vocab_size and max(ids) >= vocab_size:
            return (
                f"{field}[{i}] holds token id {max(ids)}, past the model's vocabulary; token ids are in "
                f"[0, {vocab_size - 1}]"
            )
    return ""


def sampling_problem(s: SamplingSpec, max_model_len: int) -> str:
    """The first sampling parameter outside its range, as an error message; "" when all are fine."""
    checks = (
        ("n", s.n, 1 <= s.n <= MAX_N, f"[1, {MAX_N}]"),
        (
            "temperature",
            s.temperature,
            s.temperature == 0 or MIN_TEMPERATURE <= s.temperature < math.inf,
            f"0 (greedy) or >= {MIN_TEMPERATURE}",
        ),
        ("top_p", s.top_p, 0 < s.top_p <= 1, "(0, 1]"),
        ("top_k", s.top_k, s.top_k >= -1, ">= -1 (-1 and 0 = off)"),
        (
            "max_tokens",
            s.max_tokens,
            1 <= s.max_tokens <= max_model_len,
            f"[1, {max_model_len}] (rollout.max_model_len, the context length)",
        ),
        (
            "stop",
            f"{len(s.stop)} strings",
            len(s.stop) <= MAX_STOP_STRINGS and all(s.stop),
            f"at most {MAX_STOP_STRINGS} non-empty strings",
        ),
        ("seed", s.seed, s.seed is None or 0 <= s.seed < 2**63, "None or [0, 2**63)"),
    )
    for field, value, ok, allowed in checks:
        if not ok:
            return f"sampling.{field}={value!r} is out of range; allowed: {allowed}"
    return ""


def score_problem(body: ScoreTokens, max_model_len: int, vocab_size: int = 0) -> str:
    """Why the server refuses a ``ScoreTokens`` request, or "" when it is acceptable."""
    if len(body.token_ids) != len(body.start):
        return f"score request has {len(body.token_ids)} sequences and {len(body.start)} starts; send one start each"
    for i, (ids, start) in enumerate(zip(body.token_ids, body.start, strict=True)):
        if not 1 <= start < len(ids):
            return f"start[{i}]={start} must be in [1, {len(ids) - 1}]: a scored token needs one token before it"
        if len(ids) > max_model_len:
            return f"sequence {i} is {len(ids)} tokens, longer than rollout.max_model_len={max_model_len}"
    return token_id_problem("token_ids", body.token_ids, vocab_size)


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)
