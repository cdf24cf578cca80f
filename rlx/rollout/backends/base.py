"""The interface a rollout backend implements; the server speaks to nothing else.

A backend generates completions (with the logprobs of the sampled tokens), pauses and
resumes scheduling, and loads weights bucket by bucket from an ``rlx.sync`` receiver.
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
    async def generate(self, prompt: str | list[int], sampling: SamplingSpec) -> PromptResult: ...

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
