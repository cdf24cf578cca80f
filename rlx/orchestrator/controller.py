"""Rank 0's loop: data -> generate -> reward -> logprobs/advantages -> update -> weight sync
-> checkpoint -> metrics. ``Controller.run`` is that loop; each phase is one method.

Modes: ``sync`` generates each step's batch with the newest weights; ``one_step_off`` starts
generating step k+1 before training step k, so generation overlaps the update and its
samples are at most one step stale (corrected with the engine's logprobs, see
``RunConfig.correction``); ``fully_async`` never stops generating and trains on prompt
groups as they finish, within ``trainer.max_staleness`` versions (``rlx.orchestrator.fully_async``).
Weight updates pause the servers (keeping in-flight requests) and resume them naming the new
policy version (the step whose update they hold), which labels the tokens sampled after it.

A launched server that died and was restarted (``server_restarted``, rollout.restart_on_failure)
gets nothing to generate until it holds the trainer's current weights: a sync to that server alone,
as soon as it answers health, between two commands of the trainer ranks (``ranks_busy``).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import torch
from rich.markup import escape

from rlx.config.redact import redacted
from rlx.config.schema import RunConfig
from rlx.orchestrator.collector import Collected
from rlx.orchestrator.rollouts import make_rollouts
from rlx.plugins import Plugins
from rlx.rollout.client import RolloutClient
from rlx.rollout.protocol import Resume
from rlx.tasks import DataStream, build_task
from rlx.trace import tracer
from rlx.trace.sinks import MetricsLogger
from rlx.trainer.checkpoint import resume_checkpoint
from rlx.trainer.ranks import RankGroup
from rlx.trainer.trainer import Trainer


class NonFiniteSteps(RuntimeError):
    """``trainer.max_nonfinite_steps`` steps in a row had a NaN or inf loss or gradient norm; the run stops."""


class Controller:
    def __init__(self, cfg: RunConfig, run_dir: Path, client: RolloutClient, trainer: Trainer, display) -> None:
        from rlx.sync.factory import make_sender
        from rlx.trainer.model import load_tokenizer

        self.cfg, self.run_dir, self.client, self.trainer, self.display = cfg, run_dir, client, trainer, display
        self.task = build_task(cfg.task, cfg.model.path)
        self.stream = DataStream(self.task.train, seed=cfg.task.seed)
        tokenizer = load_tokenizer(cfg.model.path)
        self.collector = make_rollouts(
            cfg, client, self.task, lambda: self.policy_version, note=lambda text: display.note(escape(text))
        )
        self.ranks = RankGroup(trainer.cfg, trainer, tokenizer.pad_token_id)
        from rlx.orchestrator.source import StepSource  # DAPO filters, rollout.dump_dir, rollout.reuse

        self.source = StepSource(cfg, self.collector, self.stream.next_batch)
        # one rank sending its weights in the engine's dtype sends them as they are (zero-copy where the
        # transport allows); LoRA sends merged weights or the adapter's factors (model.lora.sync), computed
        # or gathered per sync: nothing to adopt
        from rlx.orchestrator.colocation import Colocation

        self.colocation = Colocation(cfg.placement, client, trainer)  # colocated: trainer and engines take turns
        as_they_are = not self.ranks.active and cfg.model.engine_dtype == cfg.model.dtype and not cfg.model.lora.rank
        as_they_are = as_they_are and not self.colocation.moves_weights  # an offload takes them out of any arena
        self.sender = make_sender(
            cfg.sync, trainer.device.type, client.addresses, module=trainer.model if as_they_are else None
        )
        self.arena = self.sender.arena
        self.plugins = Plugins.load(cfg.checkpoint.plugins)
        self.start_step = 0  # the step the run continues after: ``resume`` sets it
        self.metrics: MetricsLogger | None = None  # opened by ``resume``, which knows where the curve continues
        self._prefetch: asyncio.Task | None = None
        self._state_before_prefetch = self.stream.state()
        self.policy_version = 0  # the step whose update the servers' weights hold
        self.fully_async = None  # trainer.mode=fully_async: the producer and its buffer, from the first step
        self.evals: list[tuple[int, float]] = []  # (step, held-out accuracy) of each evaluation this run made
        self.rollout_restarts = 0
        self.nonfinite_in_a_row = 0  # steps in a row the trainer skipped for a NaN or inf loss or gradient norm
        self.ranks_busy = asyncio.Lock()  # one command of the trainer ranks at a time (train, sync, checkpoint)
        self._rejoining: dict[int, asyncio.Task] = {}

    async def run(self) -> dict[str, float]:
        t = self.cfg.trainer
        self.resume()
        if self.start_step > 0 or self.cfg.rollout.engine_weights == "first_sync":
            # servers start from model.path (or, first_sync, placeholders): bring them to the trainer's weights
            await self.sync_weights()
        await self.colocation.start()
        last = {}
        if t.eval_every and self.start_step == 0:
            last.update(await self.evaluate(0))
            self.metrics.log(0, dict(last))
            self.display.step(0, last)
        for step in range(self.start_step + 1, t.total_steps + 1):
            with tracer.span("step", step=step):
                started = time.perf_counter()
                collected = await self.next_batch(step)
                metrics = dict(collected.metrics)
                metrics["time_collect"] = time.perf_counter() - started  # generate, reward, building the samples
                await self.colocation.before_train()
                async with self.ranks_busy:
                    trained = time.perf_counter()
                    metrics.update(await asyncio.to_thread(self.train, collected))
                    metrics["time_train"] = time.perf_counter() - trained  # the batch to the device, logprob, update
                self._count_nonfinite(step, metrics)
                self.policy_version = step
                await self.colocation.before_sync()
                metrics["time_sync"], metrics["sync_zero_copy"], metrics["sync_verified"] = await self.sync_weights()
                await self.colocation.after_sync()
                metrics.update(self.colocation.metrics())
                if t.eval_every and (step % t.eval_every == 0 or step == t.total_steps):
                    metrics.update(await self.evaluate(step))
                async with self.ranks_busy:  # after the evaluation: the checkpoint holds the step's whole line
                    metrics["time_checkpoint"] = self.maybe_checkpoint(step, metrics)
                metrics["time_step"] = time.perf_counter() - started
                if self.cfg.rollout.restart_on_failure:
                    metrics["rollout_restarts"] = self.rollout_restarts
            self.metrics.log(step, metrics)
            self.display.step(step, metrics)
            self.plugins.call("after_step", step, metrics)
            last = metrics
        return last

    def _count_nonfinite(self, step: int, metrics: dict[str, float]) -> None:
        """Note a step the trainer skipped for a NaN or inf loss or gradient norm; after
        ``trainer.max_nonfinite_steps`` in a row, log the step's metrics and stop the run (``NonFiniteSteps``)."""
        if not metrics.get("skipped_nonfinite"):
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        limit = self.cfg.trainer.max_nonfinite_steps
        self.display.note(
            f"step {step}: loss {metrics.get('loss')} and gradient norm {metrics.get('grad_norm')} are "
            f"not both finite; the update was skipped and the weights are unchanged "
            f"({self.nonfinite_in_a_row} such steps in a row, the run stops at {limit})"
        )
        if self.nonfinite_in_a_row >= limit:
            self.metrics.log(step, metrics)
            first = step - limit + 1
            raise NonFiniteSteps(
                f"steps {first}..{step}: the loss or gradient norm was NaN or inf in {limit} steps in a row "
                f"(trainer.max_nonfinite_steps={limit}); each was skipped, so the weights and every checkpoint "
                "written hold no NaN. Check the rewards (a reward function, or a dump rollout.reuse replays), "
                "trainer.lr and trainer.max_grad_norm, then resume (--resume) from the newest checkpoint"
            )

    async def evaluate(self, step: int) -> dict[str, float]:
        """The held-out metrics as logged: eval_accuracy, and eval_pass@k etc. with task.eval_k > 1; and time_eval,
        its seconds (a step's time_step includes them)."""
        started = time.perf_counter()
        metrics = await self.collector.evaluate(self.task.eval)
        self.evals.append((step, metrics["accuracy"]))
        return {
            **{f"eval_{name}": value for name, value in metrics.items()},
            "time_eval": time.perf_counter() - started,
        }

    async def next_batch(self, step: int) -> Collected:
        """This step's batch; in one_step_off, also start generating the next one."""
        if self.cfg.trainer.mode == "fully_async" and self.cfg.task.name != "external":  # an agent is the producer
            if self.fully_async is None:
                from rlx.orchestrator.fully_async import FullyAsyncRollout

                self.fully_async = FullyAsyncRollout(self.cfg, self.collector, self.stream, self.policy_version)
            return await self.fully_async.next_batch(self.policy_version)
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
        return asyncio.create_task(self.source.collect(step, problems, seed))

    def train(self, collected: Collected) -> dict[str, float]:
        metrics = self.ranks.train(collected.samples)
        if self.trainer.device.type == "cuda":  # rank 0's peak since the last step, all of a step's phases
            metrics["gpu_peak_gb"] = torch.cuda.max_memory_allocated(self.trainer.device) / 1e9
            torch.cuda.reset_peak_memory_stats(self.trainer.device)
        return metrics

    async def sync_weights(self) -> tuple[float, float, float]:
        """Seconds the sync took, 1.0 when it sent from the weight arena (0.0: through buckets), and 1.0 when
        every receiver's checksums matched the trainer's (sync.verify; a mismatch fails the sync).

        Goes to the live servers; when one dies during it, the sync is repeated to those left (a
        restarted server gets its own sync when it rejoins)."""
        report = None
        async with self.ranks_busy:  # a restarted server's own sync goes first when it is waiting
            started = time.perf_counter()
            with tracer.span("sync"):
                while report is None and self.client.live_indices():
                    report = await self._sync_to(self.client.live_indices(), regular=True)
            return (
                time.perf_counter() - started,
                float(report.zero_copy if report else 0.0),
                float(report.verified if report else 0.0),
            )

    async def _sync_to(self, servers: list[int], regular: bool = False):
        """One sync to ``servers``; the caller holds ``ranks_busy``. ``regular``: the live servers are
        paused around it, and it returns None when one of them died during it."""
        tensors = self.ranks.weights()
        try:
            if regular:
                await self.client.pause()
            return await self.sender.send(tensors, [self.client.channel(i) for i in servers])
        except Exception:
            if self.ranks.active:
                for _ in tensors:  # the other ranks gather every tensor: finish the collectives with them
                    pass
            if regular and await self._lost_one_of(servers):
                return None
            raise
        finally:
            if regular:
                await self.client.broadcast(Resume(weight_version=self.policy_version))

    async def _lost_one_of(self, servers: list[int], within_s: float = 2.0) -> bool:
        """Whether one of ``servers`` died (and is being restarted); the launcher notices a death within
        a second, a transport may fail on it sooner."""
        deadline = time.monotonic() + (within_s if self.cfg.rollout.restart_on_failure else 0.0)
        while set(servers) <= set(self.client.live_indices()):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def server_restarted(self, index: int, on_failure) -> None:
        """Launched server ``index`` died and was started again: route nothing to it until a sync to it
        alone has given it the current weights. ``on_failure(message)`` stops the run if it cannot."""
        address = self.client.addresses[index]
        self.rollout_restarts += 1
        tracer.event("rollout.restart", server=f"rollout{index}", address=address, restarts=self.rollout_restarts)
        self.client.mark_down(index)
        if index in self._rejoining:
            self._rejoining.pop(index).cancel()
        task = asyncio.create_task(self._rejoin(index))
        self._rejoining[index] = task

        def done(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                self.display.log(f"rollout server {address} could not rejoin: {task.exception()!r}")
                on_failure(f"rollout server {address} was restarted but could not rejoin the run: {task.exception()}")

        task.add_done_callback(done)

    async def _rejoin(self, index: int) -> None:
        from rlx.rollout.protocol import Health

        deadline = time.time() + self.cfg.rollout.startup_timeout_s
        while True:
            try:
                await self.client.call(index, Health(), timeout_s=2.0)
                break
            except Exception:
                if time.time() > deadline:
                    raise
                await asyncio.sleep(0.2)
        async with self.ranks_busy:
            with tracer.span("sync", server=f"rollout{index}"):
                await self._sync_to([index])  # the server generates nothing yet: no pause needed
            version = (await self.client.call(index, Health(), timeout_s=10.0)).weight_version
            self.client.mark_up(index)
            tracer.event(
                "rollout.rejoined",
                server=f"rollout{index}",
                address=self.client.addresses[index],
                weight_version=version,
            )
        self.display.note(
            f"rollout server {self.client.addresses[index]} is back, with the trainer's current "
            f"weights (weight version {version})"
        )

    def maybe_checkpoint(self, step: int, metrics: dict[str, float]) -> float:
        """Save when due; ``metrics`` (the step's line so far) goes into the checkpoint, so that a run stopped
        between the save and the metrics line gets the line back on --resume."""
        c, t = self.cfg.checkpoint, self.cfg.trainer
        due = (c.every and step % c.every == 0) or (c.save_final and step == t.total_steps)
        if not due:
            return 0.0
        started = time.perf_counter()
        with tracer.span("checkpoint", step=step):
            line = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
            state = {
                "step": step,
                "data": self._data_state_for_resume(),
                "run_name": self.cfg.run_name,
                "metrics": line,
            }
            self.ranks.checkpoint(step, state, before_manifest=lambda staged: self._before_manifest(staged, step))
        return time.perf_counter() - started

    def _before_manifest(self, staged: Path, step: int) -> None:
        self.trainer.save_extra(staged)  # the critic, hashed into the manifest with the rest
        self.plugins.call("on_save", staged, step)

    def _data_state_for_resume(self) -> dict:
        """The data position that makes a resumed run draw the next step's prompts next."""
        if self.fully_async is not None:
            return self.fully_async.data_state()
        if self._prefetch is not None:
            return self._state_before_prefetch
        return self.stream.state()

    def resume(self) -> None:
        """The run's first step: with ``trainer.resume``, every rank loads the newest complete checkpoint and the
        data stream continues where it was; then the metrics file opens where the curve continues."""
        restored = None
        if self.cfg.trainer.resume:
            self.start_step, restored = self._load_newest()
        self.policy_version = self.start_step
        self._state_before_prefetch = self.stream.state()
        cfg = self.cfg
        resumed = self.start_step if cfg.trainer.resume else None
        self.metrics = MetricsLogger(cfg.logging, cfg.run_name, redacted(cfg), self.run_dir, resumed)
        if restored is not None:  # stopped after the checkpoint, before its step's line: the curve has no gap
            self.metrics.log_if_missing(self.start_step, restored)

    def _load_newest(self) -> tuple[int, dict | None]:
        """The step the checkpoint holds, and the metrics line it saved (None: an older checkpoint without)."""
        ckpt, _ = resume_checkpoint(self.run_dir)  # pre-flight made the same choice and reported what it skipped
        if ckpt is None:
            self.display.note(f"no earlier run in {self.run_dir} to resume; starting from step 0")
            return 0, None
        step = int(ckpt.name.split("_")[-1])
        state = self.ranks.load(step)
        self.stream.load_state(state["data"])
        self.plugins.call("on_load", ckpt, step)
        self.display.note(f"resumed from {ckpt} (step {step})")
        return step, state.get("metrics")

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.cancel()
        if self.fully_async is not None:
            self.fully_async.close()
        for task in self._rejoining.values():
            task.cancel()
        try:
            self.ranks.stop()
        finally:  # the sync buffers and the arena are model-sized /dev/shm segments: never leave them
            self.sender.close()
            if self.arena is not None:
                self.arena.close()
            if self.metrics is not None:
                self.metrics.close()
