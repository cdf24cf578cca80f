"""DAPO's sampling filters over a step's groups (the ``n`` samples of one prompt).

Applied in this order, each counted in the step's metrics:

- soft overlong punishment (``filters.overlong=soft``): a sample longer than
  ``max_tokens - overlong_buffer`` tokens gets ``-overlong_penalty * (length - start) / overlong_buffer``
  added to its reward (DAPO eq. 13; a sample cannot pass ``max_tokens`` here) -> ``samples_overlong``;
- overlong filtering (``filters.overlong=filter``): a sample cut at ``max_tokens`` keeps its reward
  (its group's advantages see it) but trains on none of its tokens -> ``samples_overlong``;
- a token cap per group (``filters.max_group_tokens``): a group whose completions hold more tokens
  in all is dropped -> ``groups_dropped_long``;
- dynamic sampling (``filters.drop_uniform_groups``): a group whose rewards all agree has zero
  advantage everywhere, so it is dropped -> ``groups_dropped_uniform``; the caller samples more
  prompts to refill the batch (``rlx.orchestrator.source``).

The functions here are pure (lists in, lists out); nothing is generated here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.store import FiltersConfig


@dataclass
class Group:
    rewards: list[float]
    lengths: list[int]  # completion tokens of each sample
    truncated: list[bool]  # cut at max_tokens
    trains: list[bool] = field(default_factory=list)  # whether each sample's tokens carry loss; filled by ``apply``


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float) -> float:
    start = max_tokens - buffer
    return 0.0 if length <= start else -penalty * min(length - start, buffer) / buffer


def apply(groups: list[Group], f: FiltersConfig, max_tokens: int) -> tuple[list[int], dict[str, float]]:
    """Edit each group's rewards and ``trains`` in place; the indices of the groups kept and the counts."""
    counts = {"groups_dropped_uniform": 0.0, "groups_dropped_long": 0.0, "samples_overlong": 0.0}
    kept = []
    for index, group in enumerate(groups):
        group.trains = [True] * len(group.rewards)
        if f.overlong == "soft":
            for i, length in enumerate(group.lengths):
                p = overlong_penalty(length, max_tokens, f.overlong_buffer, f.overlong_penalty)
                group.rewards[i] += p
                counts["samples_overlong"] += p < 0
        elif f.overlong == "filter":
            group.trains = [not cut for cut in group.truncated]
            counts["samples_overlong"] += sum(group.truncated)
        if f.max_group_tokens and sum(group.lengths) > f.max_group_tokens:
            counts["groups_dropped_long"] += 1
        elif f.drop_uniform_groups and max(group.rewards) == min(group.rewards):
            counts["groups_dropped_uniform"] += 1
        else:
            kept.append(index)
    return kept, counts
