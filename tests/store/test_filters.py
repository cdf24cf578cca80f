"""DAPO's sampling filters on a crafted step (pure functions, no model)."""

import pytest

from rlx.config.store import FiltersConfig
from rlx.orchestrator import filters


def groups():
    return [
        filters.Group([1.0, 1.0, 1.0, 1.0], [3, 4, 5, 2], [False] * 4),  # uniform (all right)
        filters.Group([0.0, 1.0, 0.0, 0.0], [3, 8, 8, 6], [False, True, True, False]),  # two cut at max_tokens=8
        filters.Group([0.0, 0.0, 0.0, 0.0], [8, 8, 8, 8], [True] * 4),  # uniform (all wrong), all cut
        filters.Group([1.0, 0.0, 1.0, 0.0], [2, 2, 7, 1], [False] * 4),
    ]


def test_uniform_groups_are_dropped_and_counted():
    kept, counts = filters.apply(groups(), FiltersConfig(drop_uniform_groups=True), max_tokens=8)
    assert kept == [1, 3]
    assert counts == {"groups_dropped_uniform": 2.0, "groups_dropped_long": 0.0, "samples_overlong": 0.0}


def test_overlong_filter_keeps_rewards_and_masks_the_cut_samples():
    g = groups()
    kept, counts = filters.apply(g, FiltersConfig(overlong="filter"), max_tokens=8)
    assert kept == [0, 1, 2, 3] and counts["samples_overlong"] == 6.0
    assert g[1].trains == [True, False, False, True] and g[1].rewards == [0.0, 1.0, 0.0, 0.0]
    assert g[2].trains == [False] * 4 and g[3].trains == [True] * 4


def test_soft_overlong_penalty_is_linear_over_the_buffer():
    g = groups()
    f = FiltersConfig(overlong="soft", overlong_buffer=4, overlong_penalty=1.0, drop_uniform_groups=True)
    kept, counts = filters.apply(g, f, max_tokens=8)
    # lengths past 8 - 4 = 4 are penalised by (length - 4) / 4: 5 -> -0.25, 6 -> -0.5, 7 -> -0.75, 8 -> -1
    assert g[0].rewards == [1.0, 1.0, 0.75, 1.0]  # no longer uniform: kept
    assert g[1].rewards == pytest.approx([0.0, 0.0, -1.0, -0.5])
    assert g[2].rewards == [-1.0] * 4  # still uniform: dropped
    assert g[3].rewards == pytest.approx([1.0, 0.0, 0.25, 0.0])
    assert kept == [0, 1, 3]
    assert counts == {"groups_dropped_uniform": 1.0, "groups_dropped_long": 0.0, "samples_overlong": 9.0}


def test_token_cap_per_group_comes_before_the_uniform_check():
    f = FiltersConfig(max_group_tokens=20, drop_uniform_groups=True)
    kept, counts = filters.apply(groups(), f, max_tokens=8)
    assert kept == [3]  # 14 tokens, mixed rewards
    assert counts["groups_dropped_long"] == 2.0 and counts["groups_dropped_uniform"] == 1.0  # 25 and 32 tokens


@pytest.mark.parametrize(
    "override, message",
    [
        ({"overlong": "soft"}, "filters.overlong_buffer >= 1"),
        ({"overlong": "truncate"}, "filters.overlong='truncate' is not allowed"),
        ({"max_group_tokens": -1}, "filters.max_group_tokens=-1"),
    ],
)
def test_bad_filter_config_names_the_key(override, message):
    from rlx.config.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        FiltersConfig(**override)
