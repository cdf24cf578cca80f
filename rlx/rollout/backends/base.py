"""The interface a rollout backend implements; the server speaks to nothing else.

A backend generates completions (with the logprobs of the sampled tokens), pauses and
resumes scheduling, and takes weight updates: ``update_weights`` gets the bytes of one sync
request as the sender encoded them and hands them to an ``rlx.sync.receiver.SyncHandler`` where
the weights live (the vLLM workers, or the hf model); the handler's ``BucketAck`` is the reply.
A failed request aborts the sync inside the handler, so the backend generates again and takes the
next sync; ``ack.in_sync`` says whether a sync is still open (generation stays paused meanwhile).

The server validates every request before a backend sees it (``rlx.rollout.protocol``), caps
``max_tokens`` to the room the prompt leaves in the context, and sends a ``SyncAbort`` through
``update_weights`` when an open sync's sender goes silent. ``failure`` is polled: a non-empty
answer (the engine died) makes the server fail its requests and exit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from rlx.rollout.protocol import PromptResult, SamplingSpec
from rlx.sync.messages import BucketAck

if TYPE_CHECKING:
    from rlx.config.roles import RolloutRole


class Backend(ABC):
    name: str
    model_path: str
    vocab_size: int = 0
    """Rows of the model's input embedding, known once started: every token id must be below it (0 = unknown)."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def prompt_len(self, prompt: str | list[int]) -> int:
        """Tokens ``prompt`` takes in the context, as ``generate`` would tokenize it."""

    @abstractmethod
    async def generate(
        self, prompt: str | list[int], sampling: SamplingSpec, deadline: float, together: int = 0
    ) -> PromptResult:
        """Complete ``prompt``; stop spending work on it once ``time.time()`` passes ``deadline``. ``together``:
        how many prompts (this one included) were sent at once with it (``Generate.together``), 0 if not said."""

    @abstractmethod
    async def pause(self) -> None: ...

    @abstractmethod
    async def resume(self) -> None: ...

    @abstractmethod
    async def update_weights(self, payload: bytes) -> BucketAck:
        """Serve one weight-sync request (``rlx.sync.messages``, encoded) and return its ack; a
        failure is an error ack, never an exception, and leaves no sync open."""

    async def sleep(self, level: int) -> list[str]:
        """Stop scheduling and free the accelerator (``protocol.Sleep``); returns what now sleeps."""
        raise NotImplementedError(f"the {self.name} backend cannot sleep; set placement.mode=separate")

    async def wake_up(self, tags: list[str]) -> list[str]:
        """Take back ``tags`` (weights, kv_cache; empty = all); schedule again once nothing sleeps."""
        raise NotImplementedError(f"the {self.name} backend cannot sleep; set placement.mode=separate")

    async def memory_gb(self) -> tuple[float, float]:
        """Accelerator memory (GiB) held now, and its high-water mark since the previous call (which
        starts a new one); zeros on a CPU-only host."""
        return 0.0, 0.0

    async def score(self, token_ids: list[list[int]], start: list[int]) -> list[list[float]]:
        """Logprobs (temperature 1) of each sequence's tokens from ``start[i]`` on (``protocol.ScoreTokens``)."""
        raise NotImplementedError(
            f"the {self.name} backend cannot score tokens; serve the teacher with "
            "rollout.backend=hf or rollout.backend=vllm"
        )

    def failure(self) -> str:
        """Why the backend can no longer serve (its engine died), or "" while it is healthy."""
        return ""

    @abstractmethod
    async def close(self) -> None: ...


BACKENDS = {"vllm": "rlx.rollout.backends.vllm:VllmBackend", "hf": "rlx.rollout.backends.hf:HfBackend"}
"""rollout.backend -> the class that runs it, as module:class (imported only when chosen)."""


def make_backend(cfg: RolloutRole) -> Backend:
    """Build the backend named by ``cfg.rollout.backend`` (imported only when chosen)."""
    import importlib

    if cfg.rollout.backend not in BACKENDS:
        raise ValueError(f"rollout.backend={cfg.rollout.backend!r}: use {' or '.join(BACKENDS)}")
    module, _, name = BACKENDS[cfg.rollout.backend].partition(":")
    return getattr(importlib.import_module(module), name)(cfg)
