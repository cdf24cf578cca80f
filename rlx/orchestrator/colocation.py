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
                self._engine_peak("train", await self.client.broadcast(p.WakeUp(tags=["weights"])))
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
                self._engine_peak("sync", await self.client.broadcast(p.WakeUp(tags=["kv_cache"])))
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

    def _release_cache(self) -> None:
        """The trainer's cached, unallocated GPU blocks back to the device, for the engine about to wake."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _engine_peak(self, phase: str, replies: list[p.MemoryResult]) -> None:
        self._metrics[f"mem_engine_peak_{phase}_gb"] = max((r.peak_memory_gb for r in replies), default=0.0)
