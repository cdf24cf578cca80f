"""What the sample store holds and the interface every transport implements.

A *sample* is one completion of one prompt (or one row of a multi-turn episode), the one currency of a
step's data from the collectors through the filters, dumps and this store to the trainer, which pads
them into its batch (``rlx.trainer.batch.collate``). It is kept as tensors (never pickled): the prompt's and the
completion's token ids, the engine's logprob of each completion token, a loss mask, optionally the
policy version that generated each token, and scalar metadata (reward, prompt id, group, status).
A producer ``put``s samples and gets back their row ids (consecutive integers, never reused); a
consumer, in any process, opens the store from its ``StoreHandle`` and ``get``s the rows it was
told to read. Rows are freed with ``release``; a row read after its release is an error, never
another sample's bytes.

Transports: ``shm`` (one /dev/shm segment; readers map it) in ``rlx.store.shm``, and ``tcp``
(the producer serves its rows over ZeroMQ to readers on any host: msgspec headers, raw tensor bytes
in frames) in ``rlx.store.tcp``; chosen by ``create_store(kind)`` on the producer's side and by
``open_reader(handle)`` from the handle's kind.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass

import msgspec
import numpy as np
import torch

SCHEMA_VERSION = 1


class Status(enum.IntEnum):
    COMPLETE = 0  # the engine stopped by itself (EOS or a stop string)
    TRUNCATED = 1  # cut at rollout.max_tokens
    PARTIAL = 2  # interrupted (a weight update in fully_async); to be continued


@dataclass
class Sample:
    prompt_ids: torch.Tensor  # [P] long
    completion_ids: torch.Tensor  # [T] long
    logprobs: torch.Tensor  # [T] float32, the rollout engine's logprob of each sampled token
    reward: float = 0.0
    loss_mask: torch.Tensor | None = None  # [T] float32; None = every completion token trains
    versions: torch.Tensor | None = None  # [T] long, the policy version that generated each token
    prompt_id: int = -1
    group: int = -1  # samples of one prompt share a group (the GRPO group)
    status: int = Status.COMPLETE
    routes: torch.Tensor | None = None  # [P + T - 1, layers, top_k] uint8 (int16 past 255 experts): MoE routes

    @classmethod
    def of(
        cls,
        prompt_ids: list[int] | torch.Tensor,
        completion_ids: list[int],
        logprobs: list[float],
        reward: float = 0.0,
        loss_mask: list[float] | None = None,
        versions: list[int] | None = None,
        routes: torch.Tensor | None = None,
    ) -> Sample:
        """A sample from a collector's lists (``versions``: empty or None when the engine recorded none;
        ``routes``: the experts the engine routed each token to, ``rlx.rollout.protocol.Sample.routes``)."""
        return cls(
            torch.as_tensor(prompt_ids, dtype=torch.long),
            torch.tensor(completion_ids, dtype=torch.long),
            torch.tensor(logprobs, dtype=torch.float32),
            float(reward),
            None if loss_mask is None else torch.tensor(loss_mask, dtype=torch.float32),
            torch.tensor(versions, dtype=torch.long) if versions else None,
            routes=routes,
        )

    def mask(self) -> torch.Tensor:
        return torch.ones(len(self.completion_ids)) if self.loss_mask is None else self.loss_mask

    @property
    def num_bytes(self) -> int:
        t = len(self.completion_ids)
        routes = self.routes.numel() * self.routes.element_size() if self.routes is not None else 0
        return 8 * len(self.prompt_ids) + t * (8 + 4 + 4) + (8 * t if self.versions is not None else 0) + routes


def routes_from_bytes(data: bytes, shape: list[int], dtype: str) -> torch.Tensor | None:
    """A sample's MoE routes from the rollout protocol's bytes (``rlx.rollout.protocol.Sample.routes``)."""
    if not data:
        return None
    return torch.from_numpy(np.frombuffer(data, dtype=np.dtype(dtype)).copy()).view(*shape)


class StoreHandle(msgspec.Struct):
    """What a consumer needs to open a store: the transport and its payload (no secrets, no paths
    outside the transport's own naming)."""

    kind: str  # "shm" | "tcp"
    name: str  # shm: segment name in /dev/shm; tcp: the producer's tcp://ip:port
    size: int = 0  # shm: segment bytes
    max_rows: int = 0
    timeout_s: float = 0.0  # tcp: a reader's deadline per request


class SampleStore(ABC):
    """The producer's side: owns the memory (or the server); ``close`` frees it."""

    @abstractmethod
    def put(self, samples: list[Sample]) -> list[int]:
        """Store ``samples``; their row ids, consecutive. Raises a ``StoreFull`` naming the fix."""

    @abstractmethod
    def get(self, rows: list[int]) -> list[Sample]:
        """Rows read back in the producer's process."""

    @abstractmethod
    def release(self, rows: list[int]) -> None:
        """Free ``rows``; their space is reused once every older row is released too."""

    @abstractmethod
    def meta(self, rows: list[int]) -> np.ndarray:
        """As ``StoreReader.meta``."""

    @abstractmethod
    def handle(self) -> StoreHandle: ...

    @abstractmethod
    def stats(self) -> dict[str, float]:
        """``store_rows_live``, ``store_bytes_live``, ``store_occupancy`` (fraction of the capacity),
        ``store_bytes_put`` (since the last call)."""

    @abstractmethod
    def close(self) -> None: ...


class StoreReader(ABC):
    """A consumer's side."""

    @abstractmethod
    def get(self, rows: list[int]) -> list[Sample]: ...

    @abstractmethod
    def meta(self, rows: list[int]) -> np.ndarray:
        """Per row, without its tensors: ``prompt_len``, ``completion_len``, ``reward``, ``loss_tokens``,
        ``prompt_id``, ``group``, ``status`` (a numpy structured array)."""

    @abstractmethod
    def close(self) -> None: ...


class StoreFull(RuntimeError):
    pass


class RowGone(LookupError):
    """A row that was released (or never put) was asked for."""


def create_store(kind: str, capacity_mb: int, max_rows: int, timeout_s: float = 60.0) -> SampleStore:
    if kind == "shm":
        from rlx.store.shm import ShmStore

        return ShmStore(capacity_mb << 20, max_rows)
    if kind == "tcp":
        from rlx.store.tcp import TcpStore

        return TcpStore(capacity_mb << 20, max_rows, timeout_s=timeout_s)
    raise ValueError(f"store transport {kind!r} is unknown; set store.transport to shm or tcp")


def open_reader(handle: StoreHandle) -> StoreReader:
    if handle.kind == "shm":
        from rlx.store.shm import ShmStoreReader

        return ShmStoreReader(handle)
    if handle.kind == "tcp":
        from rlx.store.tcp import TcpStoreReader

        return TcpStoreReader(handle)
    raise ValueError(f"store handle of kind {handle.kind!r}: this rlx reads shm and tcp stores")
