"""Rank 0's step source over a collector's samples: DAPO's filters refill dropped groups, and when every
round is dropped the step trains on the first round's samples exactly as they were collected."""

import asyncio

from rlx.config.model import ModelConfig
from rlx.config.schema import RunConfig
from rlx.config.store import FiltersConfig
from rlx.orchestrator.collector import Collected
from rlx.orchestrator.source import StepSource
from rlx.store.base import Sample


class Rounds:
    """A collector whose every round is ``n`` samples per prompt, all with the same reward (uniform groups),
    the first sample of each group cut at ``max_tokens``."""

    def __init__(self, n: int, max_tokens: int) -> None:
        self.n, self.max_tokens, self.calls = n, max_tokens, 0

    async def collect(self, problems: list, seed: int) -> Collected:
        self.calls += 1
        samples = [
            Sample.of(
                [1, 2], [3] * (self.max_tokens if j == 0 else 2), [-0.5] * (self.max_tokens if j == 0 else 2), 1.0
            )
            for _ in problems
            for j in range(self.n)
        ]
        return Collected(samples, {"reward_mean": 1.0}, [f"text {i}" for i in range(len(samples))])


def config() -> RunConfig:
    cfg = RunConfig(model=ModelConfig(path="unused"))
    cfg.rollout.n, cfg.rollout.max_tokens = 2, 4
    cfg.filters = FiltersConfig(drop_uniform_groups=True, max_extra_rounds=2, overlong="filter")
    return cfg


def test_a_step_whose_groups_are_all_dropped_trains_on_the_first_round_as_collected():
    collector = Rounds(n=2, max_tokens=4)
    source = StepSource(config(), collector, more=lambda count: [object()] * count)
    collected = asyncio.run(source.collect(1, [object(), object()], seed=7))

    assert collector.calls == 3  # the first round and two extra rounds, every group uniform
    metrics = collected.metrics
    assert metrics["filter_fallback"] == 1.0 and metrics["filter_rounds"] == 2.0
    assert metrics["groups_dropped_uniform"] == 6.0 and metrics["samples_overlong"] == 6.0
    assert len(collected.samples) == 4 and [s.group for s in collected.samples] == [0, 0, 1, 1]
    # the filter masked the cut samples of the rounds it dropped, not the samples this step trains on
    assert [s.mask().tolist() for s in collected.samples] == [[1.0] * 4, [1.0] * 2, [1.0] * 4, [1.0] * 2]
    assert collected.completions == [f"text {i}" for i in range(4)]
