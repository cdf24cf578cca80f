"""Each choice list is defined once, beside its config section, and the dispatcher that acts on it agrees: every choice
has a handler and every handler is a choice. The dispatch tables are imported as they are; where a
dispatcher branches instead of looking up a table, each choice is run through it."""

import pytest
import torch

from rlx.config import algorithm, model, rollout, sync, task
from rlx.convert.gguf_import import PACKAGED
from rlx.rollout.backends.base import BACKENDS
from rlx.sync.transports import TRANSPORTS
from rlx.trainer.algorithms.advantages import ESTIMATORS
from rlx.trainer.algorithms.aggregation import LossAgg
from rlx.trainer.algorithms.correction import rollout_correction
from rlx.trainer.algorithms.kl import KL_ESTIMATORS, kl_estimate
from rlx.trainer.algorithms.policy_loss import LOSSES
from rlx.trainer.critic import Critic
from rlx.trainer.preflight import RANDOM_BUILDS
from rlx.trainer.warmstart import RECIPES

CRITIC_ADVANTAGES = {"gae": Critic}
"""The advantage the trainer computes with its critic (``rlx.trainer.critic``) instead of an estimator."""
BUILT_ELSEWHERE = {""} | set(RANDOM_BUILDS) | set(PACKAGED)
"""model.build_if_missing values pre-flight builds without a warm-start recipe ('' = build nothing; random-weight
shapes; the real models are imported from their packaged GGUF files)."""


@pytest.mark.parametrize(
    "choices, handlers",
    [
        (algorithm.ADVANTAGE_CHOICES, {**ESTIMATORS, **CRITIC_ADVANTAGES}),
        (algorithm.POLICY_LOSS_CHOICES, LOSSES),
        (algorithm.KL_CHOICES, KL_ESTIMATORS),
        (rollout.BACKEND_CHOICES, BACKENDS),
        (tuple(c for c in sync.TRANSPORT_CHOICES if c != "auto"), TRANSPORTS),
        (
            tuple(c for c in model.BUILD_CHOICES if c not in BUILT_ELSEWHERE),
            [r for r in RECIPES if r not in algorithm.TEACHER_BUILD_CHOICES],
        ),
        (tuple(c for c in algorithm.TEACHER_BUILD_CHOICES if c), [r for r in RECIPES if r not in model.BUILD_CHOICES]),
    ],
    ids=[
        "advantage",
        "policy_loss",
        "kl_estimator",
        "backend",
        "transport",
        "build_if_missing",
        "teacher_build_if_missing",
    ],
)
def test_every_choice_has_a_handler_and_every_handler_is_a_choice(choices, handlers):
    assert len(set(choices)) == len(choices), f"a choice is listed twice: {choices}"
    assert set(choices) == set(handlers), (
        f"choices without a handler: {sorted(set(choices) - set(handlers))}; "
        f"handlers no config can pick: {sorted(set(handlers) - set(choices))}"
    )


def test_transport_auto_resolves_to_a_handled_transport():
    from rlx.sync.factory import pick_transport

    assert pick_transport("auto", "cpu") in TRANSPORTS
    assert pick_transport("auto", "cpu", ["tcp://10.0.0.7:5000"]) in TRANSPORTS


def _logps():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 5, generator=gen)
    return logp, logp - 0.1 * torch.rand(2, 5, generator=gen), torch.ones(2, 5)


@pytest.mark.parametrize("mode", algorithm.LOSS_AGG_CHOICES)
def test_every_loss_aggregation_choice_is_applied(mode):
    logp, _, mask = _logps()
    assert torch.isfinite(LossAgg(mode, global_tokens=10.0, global_seqs=2.0, max_len=5)(logp, mask))


def test_a_loss_aggregation_outside_the_choices_is_refused():
    with pytest.raises(ValueError, match="algorithm.loss_agg"):
        LossAgg("seq_sum", global_tokens=10.0, global_seqs=2.0, max_len=5)


@pytest.mark.parametrize("method", algorithm.CORRECTION_CHOICES)
def test_every_rollout_correction_choice_is_applied(method):
    old, rollout, mask = _logps()
    weights, metrics = rollout_correction(
        old, rollout, mask, method=method, level="token", tis_cap=2.0, icepop_low=0.5, icepop_high=2.0
    )
    assert (weights is None) == (method in ("none", "bypass")) and metrics["logprob_diff_mean"] > 0


def test_a_correction_or_kl_estimator_outside_the_choices_is_refused():
    old, rollout, mask = _logps()
    with pytest.raises(ValueError, match="algorithm.rollout_correction"):
        rollout_correction(
            old, rollout, mask, method="clip", level="token", tis_cap=2.0, icepop_low=0.5, icepop_high=2.0
        )
    with pytest.raises(ValueError, match="algorithm.kl_estimator"):
        kl_estimate(old, rollout, "k4")


def test_every_task_choice_has_a_task_and_every_task_a_choice():
    from rlx.tasks import TASKS

    assert set(task.TASK_CHOICES) == set(TASKS) and len(task.TASK_CHOICES) == len(TASKS)
    for name, ref in TASKS.items():  # each entry names a class that exists and makes itself from the config
        module, _, attr = ref.partition(":")
        assert hasattr(getattr(__import__(module, fromlist=[attr]), attr), "from_config"), name


def test_every_random_build_names_a_builder_of_the_tiny_models():
    from rlx.trainer import tiny

    for choice, (builder, what) in RANDOM_BUILDS.items():
        assert choice in model.BUILD_CHOICES, choice
        assert callable(getattr(tiny, builder)), f"{choice}: rlx.trainer.tiny has no {builder}"
        assert what, choice


def test_random_qwen2_builds_have_the_published_sizes():
    """qwen2_{0p5b,1p5b,7b}_random: Qwen2.5's shapes, counted on the meta device (rlx doctor's count), against the
    model cards' parameter counts (0.49B, 1.54B, 7.61B; tied embeddings below 7B)."""
    from rlx.launch.doctor import _planned_parameter_count

    published = {"qwen2_0p5b_random": 0.494, "qwen2_1p5b_random": 1.544, "qwen2_7b_random": 7.616}
    for build, billions in published.items():
        assert _planned_parameter_count(build) / 1e9 == pytest.approx(billions, abs=0.001), build
