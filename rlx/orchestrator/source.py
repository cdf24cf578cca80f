"""Where each step's samples come from: generated (through DAPO's filters), an earlier run's dump, or both.

``StepSource.collect`` is what the controller awaits for a step's batch. Without filters, dump or
reuse it is the collector's own ``collect``. Otherwise:

- ``rollout.reuse=replay``: every step is read from the dump (no generation; the rollout servers
  still start and receive weight syncs, so eval runs as usual). A replay of a dump trains on the
  same rows, in the same layout, as the run that wrote it, so a deterministic trainer repeats its
  losses bit for bit.
- ``rollout.reuse=first_k``: steps 1..``rollout.reuse_steps`` from the dump, then generated.
- ``rollout.reuse=mix``: the first ``round(reuse_fraction * prompts_per_step)`` groups of the dump's
  step, the rest generated for the step's remaining prompts.
- filters (``rlx.orchestrator.filters``) apply to generated groups; dropped groups are refilled with more
  prompts from the data stream, at most ``filters.max_extra_rounds`` times (then the batch trains
  with fewer groups; if none is left, with the first round's groups unfiltered: ``filter_fallback``).
- ``rollout.dump_dir``: the samples that train are written after the step is collected.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from rlx.config.schema import RunConfig
from rlx.orchestrator import filters
from rlx.orchestrator.collector import Collected
from rlx.orchestrator.rollouts import Rollouts
from rlx.store.base import Sample, Status

EXTRA_ROUND_SEED = 100_003  # an extra round of a step samples with the step's seed plus this, times the round


class StepSource:
    def __init__(self, cfg: RunConfig, collector: Rollouts, more: Callable[[int], list]) -> None:
        from rlx.store.dump import DumpWriter, check_dump

        self.cfg, self.collector, self.more = cfg, collector, more
        self.dump = (
            check_dump(cfg.model.path, cfg.rollout, cfg.trainer.total_steps, contents=False)
            if cfg.rollout.reuse
            else None
        )  # pre-flight read them
        self.writer = DumpWriter(cfg.model.path, cfg.rollout, cfg.task) if cfg.rollout.dump_dir else None

    @property
    def passthrough(self) -> bool:
        return self.dump is None and self.writer is None and not self.cfg.filters.active

    async def collect(self, step: int, problems: list, seed: int) -> Collected:
        if self.passthrough:
            return await self.collector.collect(problems, seed)
        r = self.cfg.rollout
        if r.reuse == "replay" or (r.reuse == "first_k" and step <= r.reuse_steps):
            samples, metrics, texts = self.dump.step(step)
            metrics = dict(metrics, reused_fraction=1.0)
        elif r.reuse == "mix":
            samples, metrics, texts = self._mixed(step, problems)
            if len(problems) > len(samples) // r.n:
                fresh, fresh_metrics, fresh_texts = await self._generate(problems[len(samples) // r.n :], seed)
                metrics = dict(fresh_metrics, reused_fraction=len(samples) / (len(samples) + len(fresh)))
                samples, texts = samples + fresh, texts + fresh_texts
        else:
            samples, metrics, texts = await self._generate(problems, seed)
        for i, sample in enumerate(samples):
            sample.group = i // r.n
        if self.writer is not None:
            self.writer.write(step, samples, metrics, texts)
        return Collected(samples, metrics, texts)

    def _mixed(self, step: int, problems: list) -> tuple[list[Sample], dict, list[str]]:
        n = self.cfg.rollout.n
        groups = round(self.cfg.rollout.reuse_fraction * len(problems))
        samples, metrics, texts = self.dump.step(step)
        return samples[: groups * n], metrics, texts[: groups * n]

    async def _generate(self, problems: list, seed: int) -> tuple[list[Sample], dict, list[str]]:
        collected = await self.collector.collect(problems, seed)
        f = self.cfg.filters
        if not f.active:
            return list(collected.samples), dict(collected.metrics), list(collected.completions)
        started = time.perf_counter()
        kept, texts, counts = self._filtered(collected)
        first = (list(collected.samples), list(collected.completions))
        rounds = 0
        while f.drop_uniform_groups and len(kept) < len(problems) and rounds < f.max_extra_rounds:
            rounds += 1
            extra = await self.collector.collect(self.more(len(problems) - len(kept)), seed + EXTRA_ROUND_SEED * rounds)
            more_kept, more_texts, more_counts = self._filtered(extra)
            kept, texts = kept + more_kept, texts + more_texts
            counts = {k: counts[k] + more_counts[k] for k in counts}
        n = self.cfg.rollout.n
        kept, texts = [s for g in kept[: len(problems)] for s in g], texts[: len(problems) * n]
        metrics = dict(
            collected.metrics,
            **counts,
            filter_rounds=float(rounds),
            groups_trained=len(kept) / n,
            filter_fallback=float(not kept),
            time_filter=time.perf_counter() - started,
        )
        return (kept, metrics, texts) if kept else (*first[:1], metrics, first[1])

    def _filtered(self, collected: Collected) -> tuple[list[list[Sample]], list[str], dict[str, float]]:
        """The kept groups (lists of samples, rewards and masks edited), their texts, the counts."""
        n, max_tokens = self.cfg.rollout.n, self.cfg.rollout.max_tokens
        samples = [dataclasses.replace(s) for s in collected.samples]  # the unfiltered round stays as it came
        for s in samples:
            s.status = Status.TRUNCATED if len(s.completion_ids) >= max_tokens else Status.COMPLETE
        grouped = [samples[i : i + n] for i in range(0, len(samples), n)]
        groups = [
            filters.Group(
                [s.reward for s in g], [len(s.completion_ids) for s in g], [s.status == Status.TRUNCATED for s in g]
            )
            for g in grouped
        ]
        kept, counts = filters.apply(groups, self.cfg.filters, max_tokens)
        for group, members in zip(groups, grouped, strict=True):
            for sample, reward, trains in zip(members, group.rewards, group.trains, strict=True):
                sample.reward = reward
                if not trains:
                    sample.loss_mask = sample.mask() * 0
        texts = [t for i in kept for t in collected.completions[i * n : (i + 1) * n]]
        return [grouped[i] for i in kept], texts, counts
