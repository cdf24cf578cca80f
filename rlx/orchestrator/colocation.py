"""Rank 0's side of ``placement.mode=colocated``: trainer and rollout engines take turns on the same GPUs.

One step, in order (the controller calls the hooks; each is a no-op in ``separate`` mode)::

    generate -> engines Sleep(level) -> trainer onload -> train        (before_train)
             -> engines WakeUp([weights]) -> sync                      (before_sync)
             -> trainer offload -> engines WakeUp([kv_cache])          (after_sync)
             -> generate ...

The trainer keeps its weights on the GPU through the sync (it sends from them) and offloads after it;
the engines take their weights back before the sync (it writes into them) and their KV cache only once
the trainer is gone. Before each wake the trainer hands its allocator's cached blocks back to the device
(``torch.cuda.empty_cache``), offloaded or not: what the update held for its activations would otherwise stay
reserved in the trainer (135 GiB after a Megatron update of the Qwen 0.5B on an H200) and the engine could not
wake.
Each phase's memory high-water mark goes into the step's metrics:
``mem_peak_{generate,train,sync}_gb`` for the trainer (its allocator, ``rlx.trainer.offload.PhasePeaks``)
and ``mem_engine_peak_{...}_gb`` for the engines (the largest any server reports in its Sleep / WakeUp
reply). Every switch is a trace span (``colocate.*`` here, ``engine.sleep`` / ``engine.wake_up`` in the
servers), so the order can be read from the trace. It leaves out several trainer ranks offloading
(``placement.offload`` refuses them) and overlapping any of these moves with compute.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rlx.config.placement import PlacementConfig
from rlx.rollout import protocol as p
from rlx.trace import tracer
from rlx.trainer.offload import Offloader, PhasePeaks

if TYPE_CHECKING:
    from rlx.rollout.client import RolloutClient
    from rlx.trainer.trainer import Trainer


class EngineWakeFailed(RuntimeError):
    """A colocated engine could not take its weights or KV cache back; the message names the memory and the keys."""


def wake_failure(tags: list[str], error: str, device, offloading: bool, engine_gb: float = 0.0) -> str:
    """One line: what failed to wake, the engine's error, the memory the engine held awake in its last generation
    (``engine_gb``, where one ran), the GPU's memory as the trainer sees it, and (when the engine ran out of memory)
    the keys that leave it room."""
    names = {"weights": "weights", "kv_cache": "KV cache"}
    what = " and ".join(names.get(tag, tag) for tag in tags) or "weights and KV cache"
    line = f"the rollout engine could not wake its {what}: {error.strip().splitlines()[0] if error.strip() else error}"
    if engine_gb > 0:
        line += f"; the engine held {engine_gb:.2f} GiB awake in its last generation"
    if device.type == "cuda":
        from rlx.trainer.memory import gpu_memory

        line += f"; the trainer's side of the GPU: {gpu_memory(device)}"
    if "memory" in error.lower():
        keys = (
            []
            if offloading
            else ["placement.offload=true (the trainer's state leaves the GPU while the engine is awake)"]
        )
        keys.append("a smaller rollout.kv_cache_gb (the engine's KV cache, taken back at each wake)")
        line += ". To leave the engine room: " + " or ".join(keys)
    return line


class Colocation:
    def __init__(self, pl: PlacementConfig, client: RolloutClient, trainer: Trainer) -> None:
        from rlx.placement import apply_memory_budget

        self.client = client
        self.enabled = pl.mode == "colocated"
        self.sleep_level = pl.sleep_level if self.enabled else 0
        self.offloader = (
            Offloader([trainer.model, trainer.ref_model], trainer.optimizer, trainer.device)
            if self.enabled and pl.offload
            else None
        )
        self.device = trainer.device
        self.peaks = PhasePeaks(trainer.device)
        self._metrics: dict[str, float] = {}
        self._switch_s = 0.0
        self._engine_awake_gb = 0.0  # the engine's peak in its last generation (its peak before it slept)
        if trainer.device.type == "cuda":
            apply_memory_budget(pl.gpu_memory_gb)

    @property
    def moves_weights(self) -> bool:
        """The trainer's parameters leave the device between steps (so no weight arena may hold them)."""
        return self.offloader is not None and self.offloader.active

    async def start(self) -> None:
        """Before the first generation: the engines get the GPU."""
        if self.enabled:
            self._offload()
            self.peaks.start()

    async def before_train(self) -> None:
        if not self.enabled:
            return
        started = time.perf_counter()
        self._metrics["mem_peak_generate_gb"] = self.peaks.peak_gb()
        if self.sleep_level:
            with tracer.span("colocate.engine_sleep", level=self.sleep_level):
                self._engine_peak("generate", await self.client.broadcast(p.Sleep(level=self.sleep_level)))
        if self.offloader is not None:
            with tracer.span("colocate.onload") as span:
                span.set(bytes=self.offloader.onload())
        self._switch_s += time.perf_counter() - started
        self.peaks.start()

    async def before_sync(self) -> None:
        if not self.enabled:
            return
        started = time.perf_counter()
        self._metrics["mem_peak_train_gb"] = self.peaks.peak_gb()
        self.peaks.start()
        if self.sleep_level:
            self._release_cache()
            with tracer.span("colocate.engine_wake", tags="weights"):
                self._engine_peak("train", await self._wake(["weights"]))
        self._switch_s += time.perf_counter() - started

    async def after_sync(self) -> None:
        if not self.enabled:
            return
        started = time.perf_counter()
        self._metrics["mem_peak_sync_gb"] = self.peaks.peak_gb()
        self._offload()
        if self.sleep_level:
            self._release_cache()
            with tracer.span("colocate.engine_wake", tags="kv_cache"):
                self._engine_peak("sync", await self._wake(["kv_cache"]))
        self._switch_s += time.perf_counter() - started
        self.peaks.start()

    def metrics(self) -> dict[str, float]:
        """This step's memory peaks and the seconds spent switching turns; empty in separate mode."""
        if not self.enabled:
            return {}
        out = dict(self._metrics, time_colocate_switch=self._switch_s)
        self._metrics, self._switch_s = {}, 0.0
        return out

    def _offload(self) -> None:
        if self.offloader is not None:
            with tracer.span("colocate.offload") as span:
                span.set(bytes=self.offloader.offload())
        self._metrics["mem_trainer_offloaded_gb"] = self.peaks.now_gb()

    async def _wake(self, tags: list[str]) -> list[p.MemoryResult]:
        """WakeUp(tags) on every engine; one that cannot wake stops the run with ``EngineWakeFailed``."""
        from rlx.rollout.client import RolloutServerError

        try:
            return await self.client.broadcast(p.WakeUp(tags=tags))
        except RolloutServerError as exc:
            line = wake_failure(tags, str(exc), self.device, self.offloader is not None, self._engine_awake_gb)
            raise EngineWakeFailed(line) from exc

    def _release_cache(self) -> None:
        """The trainer's cached, unallocated GPU blocks back to the device, for the engine about to wake."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _engine_peak(self, phase: str, replies: list[p.MemoryResult]) -> None:
        peak = max((r.peak_memory_gb for r in replies), default=0.0)
        self._metrics[f"mem_engine_peak_{phase}_gb"] = peak
        if phase == "generate" and peak > 0:
            self._engine_awake_gb = peak  # what a wake must find room for again
