"""The interface a rollout backend implements; the server speaks to nothing else.

A backend generates completions (with the logprobs of the sampled tokens), pauses and
resumes scheduling, and loads weights bucket by bucket from an ``rlx.sync`` receiver.

The server validates every request before a backend sees it (``rlx.rollout.protocol``), caps
``max_tokens`` to the room the prompt leaves in the context, and drives the sync state: after
``update_begin`` the backend gets ``update_end`` or, when the sync failed or its sender vanished,
``update_abort``; either must leave it able to generate and to begin the next sync. ``failure``
is polled: a non-empty answer (the engine died) makes the server fail its requests and exit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from rlx.rollout.protocol import PromptResult, SamplingSpec
from rlx.sync.messages import BucketAck, SyncBegin, SyncBucket, SyncEnd


class Backend(ABC):
    name: str
    model_path: str

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def prompt_len(self, prompt: str | list[int]) -> int:
        """Tokens ``prompt`` takes in the context, as ``generate`` would tokenize it."""

    @abstractmethod
    async def generate(self, prompt: str | list[int], sampling: SamplingSpec, deadline: float) -> PromptResult:
        """Complete ``prompt``; stop spending work on it once ``time.time()`` passes ``deadline``."""

    @abstractmethod
    async def pause(self) -> None: ...

    @abstractmethod
    async def resume(self) -> None: ...

    @abstractmethod
    async def update_begin(self, req: SyncBegin) -> None: ...

    @abstractmethod
    async def update_bucket(self, req: SyncBucket) -> BucketAck: ...

    @abstractmethod
    async def update_end(self, req: SyncEnd) -> BucketAck: ...

    @abstractmethod
    async def update_abort(self) -> None:
        """Drop the sync in progress (no ``update_end`` will come) and let generation run again."""

    def failure(self) -> str:
        """Why the backend can no longer serve (its engine died), or "" while it is healthy."""
        return ""

    @abstractmethod
    async def close(self) -> None: ...


def make_backend(cfg) -> Backend:
    """Build the backend named by ``cfg.rollout.backend`` (imported only when chosen)."""
    if cfg.rollout.backend == "vllm":
        from rlx.rollout.backends.vllm import VllmBackend

        return VllmBackend(cfg)
    if cfg.rollout.backend == "hf":
        from rlx.rollout.backends.hf import HfBackend

        return HfBackend(cfg)
    raise ValueError(f"rollout.backend={cfg.rollout.backend!r}: use vllm or hf")
