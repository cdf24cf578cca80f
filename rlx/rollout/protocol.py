"""Wire protocol between rollout clients and `rlx rollout-serve`: msgspec structs over msgpack.

Every message is an envelope (``Request`` / ``Reply``) carrying the protocol version, a
request id, an absolute deadline and the auth token; the body is a tagged union, so a
decoder accepts only the structs listed here. Nothing is ever pickled. The weight-update
bodies wrap the ``rlx.sync.messages`` structs that the sender and receiver share.
"""

from __future__ import annotations

import time
from typing import Union

import msgspec

from rlx.sync.messages import BucketAck, SyncBegin, SyncBucket, SyncEnd

PROTOCOL_VERSION = 1


class SamplingSpec(msgspec.Struct, frozen=True):
    """Sampling parameters of one generate request (vLLM's names and meanings)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: list[str] = []
    seed: int | None = None


class Generate(msgspec.Struct, tag="generate"):
    """Generate ``sampling.n`` completions for each prompt (text or token ids)."""

    prompts: list[str] = []
    prompt_token_ids: list[list[int]] = []
    sampling: SamplingSpec = SamplingSpec()


class Pause(msgspec.Struct, tag="pause"):
    """Stop scheduling; in-flight requests are kept (not aborted) until ``Resume``."""


class Resume(msgspec.Struct, tag="resume"):
    pass


class Health(msgspec.Struct, tag="health"):
    pass


class Stats(msgspec.Struct, tag="stats"):
    pass


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


class UpdateBegin(msgspec.Struct, tag="update_begin"):
    begin: SyncBegin


class UpdateBucket(msgspec.Struct, tag="update_bucket"):
    bucket: SyncBucket


class UpdateEnd(msgspec.Struct, tag="update_end"):
    end: SyncEnd


RequestBody = Union[Generate, Pause, Resume, Health, Stats, Shutdown, UpdateBegin, UpdateBucket, UpdateEnd]


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


class StatsResult(msgspec.Struct, tag="stats_result"):
    in_flight: int
    completed: int
    generated_tokens: int
    paused: bool
    weight_version: int
    uptime_s: float


class AckResult(msgspec.Struct, tag="ack_result"):
    ack: BucketAck


ReplyBody = Union[GenerateResult, Ok, HealthResult, StatsResult, AckResult]


class Reply(msgspec.Struct):
    id: int
    ok: bool
    body: ReplyBody | None = None
    error: str = ""
    version: int = PROTOCOL_VERSION


_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()


def encode(message: Request | Reply) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes) -> Request:
    """Raises ``msgspec.ValidationError`` / ``DecodeError`` on anything but a valid Request."""
    return _request_decoder.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)


def deadline_in(seconds: float) -> float:
    return time.time() + seconds
