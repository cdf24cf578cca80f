"""``SamplingConfig``: the one view of how completions are sampled that the collector and the trainer read,
built from the rollout section's keys (users keep writing rollout.temperature, rollout.n, ...)."""

import dataclasses
from pathlib import Path

import pytest

from rlx.config import ConfigError, load_config
from rlx.config.rollout import RolloutConfig, SamplingConfig

QUICKSTART = Path(__file__).parents[2] / "configs" / "quickstart.yaml"


def test_rollout_overrides_reach_the_sampling_view():
    cfg = load_config(
        QUICKSTART,
        [
            "rollout.temperature=0.7",
            "rollout.n=3",
            "rollout.top_p=0.9",
            "rollout.top_k=5",
            "rollout.max_tokens=12",
            "rollout.stop=[END]",
        ],
    )
    assert cfg.sampling == SamplingConfig(n=3, temperature=0.7, top_p=0.9, top_k=5, max_tokens=12, stop=("END",))
    assert cfg.rollout.sampling == cfg.sampling


def test_every_sampling_field_is_a_rollout_key_with_the_same_default():
    rollout = {f.name: f for f in dataclasses.fields(RolloutConfig)}
    for f in dataclasses.fields(SamplingConfig):
        assert f.name in rollout, f"SamplingConfig.{f.name} has no rollout.{f.name} key users can set"
        default = (
            rollout[f.name].default_factory()
            if rollout[f.name].default is dataclasses.MISSING
            else rollout[f.name].default
        )
        assert getattr(SamplingConfig(), f.name) == (tuple(default) if f.name == "stop" else default), f.name
    assert RolloutConfig().sampling == SamplingConfig()


def test_the_view_is_read_only_and_the_rollout_section_stays_the_source():
    cfg = load_config(QUICKSTART)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sampling.temperature = 0.5
    cfg.rollout.temperature = 0.5
    assert cfg.sampling.temperature == 0.5


@pytest.mark.parametrize("temperature, divisor", [(0.0, 1.0), (0.5, 0.5), (1.3, 1.3)])
def test_logprob_temperature_is_the_sampling_one_and_one_for_greedy(temperature, divisor):
    assert SamplingConfig(temperature=temperature).logprob_temperature == divisor


def test_a_bad_sampling_value_is_still_named_by_its_rollout_key():
    with pytest.raises(ConfigError, match=r"rollout\.temperature=0\.001"):
        load_config(QUICKSTART, ["rollout.temperature=0.001"])


def test_a_request_and_a_dump_manifest_carry_every_sampling_field():
    """The wire's SamplingSpec declares each SamplingConfig field (it adds the request's seed), and a request made
    from the run's sampling carries them all: the fields are listed once, in SamplingConfig."""
    from rlx.rollout.protocol import SamplingSpec

    sampling = SamplingConfig(n=3, temperature=0.7, top_p=0.9, top_k=5, max_tokens=12, stop=("END",))
    names = [f.name for f in dataclasses.fields(SamplingConfig)]
    assert set(names) <= set(SamplingSpec.__struct_fields__)
    spec = SamplingSpec.of(sampling, n=1)
    assert {name: getattr(spec, name) for name in names} == {**sampling.as_dict(), "n": 1}
    assert sampling.as_dict() == {
        "n": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 12,
        "stop": ["END"],
    }
