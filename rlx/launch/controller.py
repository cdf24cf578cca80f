"""Rank 0's loop: data -> generate -> reward -> logprobs/advantages -> update -> weight sync
-> checkpoint -> metrics. ``Controller.run`` is that loop; each phase is one method.

Modes: ``sync`` generates each step's batch with the newest weights; ``one_step_off`` starts
generating step k+1 before training step k, so generation overlaps the update and its
samples are at most one step stale (corrected with the engine's logprobs, see
``RunConfig.correction``). Weight updates pause the servers (keeping in-flight requests)
and resume them after.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from rlx.engine.batch import broadcast_batch
from rlx.engine.checkpoint import load_checkpoint, resume_checkpoint, save_checkpoint
from rlx.engine.trainer import Trainer
from rlx.launch.ranks import Command, RankBus
from rlx.plugins import Plugins
from rlx.rollout.client import RolloutClient
from rlx.rollout.collector import Collected, Collector
from rlx.rollout.tasks import DataStream, build_task
from rlx.trace import tracer
from rlx.trace.sinks import MetricsLogger


class Controller:
    def __init__(self, cfg, run_dir: Path, client: RolloutClient, trainer: Trainer, display) -> None:
        from rlx.engine.model import load_tokenizer
        from rlx.sync.factory import make_sender

        self.cfg, self.run_dir, self.client, self.trainer, self.display = cfg, run_dir, client, trainer, display
        self.task = build_task(cfg.task)
        self.stream = DataStream(self.task.train, seed=cfg.task.seed)
        tokenizer = load_tokenizer(cfg.model.path)
        self.collector = Collector(cfg, client, self.task, tokenizer.pad_token_id)
        self.bus = RankBus(trainer.device)
        # one rank sending its weights in the engine's dtype sends them as they are (zero-copy where the
        # transport allows); LoRA sends merged weights, computed per sync: nothing to adopt
        as_they_are = not self.bus.active and cfg.model.engine_dtype == cfg.model.dtype and not cfg.model.lora.rank
        self.sender = make_sender(cfg.sync, trainer.device.type, client.addresses,
                                  module=trainer.model if as_they_are else None)
        self.arena = self.sender.arena
        self.ckpt_root = run_dir / "checkpoints"
        self.plugins = Plugins.load(cfg.checkpoint.plugins)
        self.start_step = self._resume() if cfg.trainer.resume else 0
        self.metrics = MetricsLogger(cfg, run_dir, self.start_step if cfg.trainer.resume else None)
        self._prefetch: asyncio.Task | None = None
        self._state_before_prefetch = self.stream.state()
        self.first_eval = float("nan")

    async def run(self) -> dict[str, float]:
        t = self.cfg.trainer
        if self.start_step > 0:
            await self.sync_weights()  # servers start from model.path; bring them to the checkpoint
        last = {}
        if t.eval_every and self.start_step == 0:
            last["eval_accuracy"] = self.first_eval = await self.collector.evaluate(self.task.eval)
            self.metrics.log(0, dict(last))
            self.display.step(0, last)
        for step in range(self.start_step + 1, t.total_steps + 1):
            with tracer.span("step", step=step):
                started = time.perf_counter()
                collected = await self.next_batch(step)
                metrics = dict(collected.metrics)
                metrics.update(await asyncio.to_thread(self.train, collected))
                metrics["time_sync"], metrics["sync_zero_copy"] = await self.sync_weights()
                metrics["time_checkpoint"] = self.maybe_checkpoint(step)
                if t.eval_every and (step % t.eval_every == 0 or step == t.total_steps):
                    metrics["eval_accuracy"] = await self.collector.evaluate(self.task.eval)
                metrics["time_step"] = time.perf_counter() - started
            self.metrics.log(step, metrics)
            self.display.step(step, metrics)
            self.plugins.call("after_step", step, metrics)
            last = metrics
        return last

    async def next_batch(self, step: int) -> Collected:
        """This step's batch; in one_step_off, also start generating the next one."""
        if self._prefetch is None:
            self._prefetch = self._generate(step)
        collected = await self._prefetch
        self._prefetch = None
        if self.cfg.trainer.mode == "one_step_off" and step < self.cfg.trainer.total_steps:
            self._prefetch = self._generate(step + 1)
            await asyncio.sleep(0)  # let the requests go out before the update blocks this rank
        return collected

    def _generate(self, step: int) -> asyncio.Task:
        self._state_before_prefetch = self.stream.state()
        problems = self.stream.next_batch(self.cfg.trainer.prompts_per_step)
        seed = self.cfg.trainer.seed * 1_000_003 + step
        return asyncio.create_task(self.collector.collect(problems, seed=seed))

    def train(self, collected: Collected) -> dict[str, float]:
        self.bus.announce(Command.TRAIN)
        batch = collected.batch
        if self.bus.active:
            batch = broadcast_batch(batch, self.trainer.device).to(torch.device("cpu"))
        return self.trainer.step(batch)

    async def sync_weights(self) -> tuple[float, float]:
        """Seconds the sync took, and 1.0 when it sent from the weight arena (0.0: through buckets)."""
        started = time.perf_counter()
        with tracer.span("sync"):
            self.bus.announce(Command.SYNC)
            await self.client.pause()
            try:
                report = await self.sender.send(self.trainer.named_tensors(), self.client.channels())
            finally:
                await self.client.resume()
        return time.perf_counter() - started, float(report.zero_copy)

    def maybe_checkpoint(self, step: int) -> float:
        c, t = self.cfg.checkpoint, self.cfg.trainer
        due = (c.every and step % c.every == 0) or (c.save_final and step == t.total_steps)
        if not due:
            return 0.0
        started = time.perf_counter()
        with tracer.span("checkpoint", step=step):
            self.bus.announce(Command.CHECKPOINT, step)
            state = {"step": step, "data": self._data_state_for_resume(), "run_name": self.cfg.run_name}
            save_checkpoint(self.ckpt_root, step, self.trainer.model, self.trainer.optimizer, self.trainer.scheduler,
                            self.cfg.model.path, state, c.keep,
                            before_manifest=lambda staged: self.plugins.call("on_save", staged, step))
        return time.perf_counter() - started

    def _data_state_for_resume(self) -> dict:
        """The data position that makes a resumed run draw the next step's prompts next."""
        if self._prefetch is not None:
            return self._state_before_prefetch
        return self.stream.state()

    def _resume(self) -> int:
        ckpt, _ = resume_checkpoint(self.run_dir)  # pre-flight made the same choice and reported what it skipped
        if ckpt is None:
            self.display.note(f"no earlier run in {self.run_dir} to resume; starting from step 0")
            return 0
        step = int(ckpt.name.split("_")[-1])
        self.bus.announce(Command.LOAD, step)
        state = load_checkpoint(ckpt, self.trainer.model, self.trainer.optimizer, self.trainer.scheduler)
        self.stream.load_state(state["data"])
        self.plugins.call("on_load", ckpt, step)
        self.display.note(f"resumed from {ckpt} (step {step})")
        return step

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.cancel()
        try:
            self.bus.announce(Command.STOP)
        finally:  # the sync buffers and the arena are model-sized /dev/shm segments: never leave them
            self.sender.close()
            if self.arena is not None:
                self.arena.close()
            self.metrics.close()
