"""Algorithms against small hand-computed examples, plus split invariance of the loss aggregation.

Expected numbers are worked out by hand in the comments next to them, never by calling the
code under test.
"""

import math

import pytest
import torch

from rlx.trainer.algorithms.advantages import compute_advantages
from rlx.trainer.algorithms.aggregation import LossAgg
from rlx.trainer.algorithms.correction import rollout_correction
from rlx.trainer.algorithms.entropy import entropy_bonus, entropy_from_logits
from rlx.trainer.algorithms.kl import kl_estimate, kl_penalized_rewards
from rlx.trainer.algorithms.policy_loss import policy_loss

LN2, LN3 = math.log(2.0), math.log(3.0)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float32), torch.as_tensor(expected, dtype=torch.float32), atol=atol, rtol=0
    )


# -- advantages: two prompts, n = 3: rewards [1, 0, 0] and [3, 1, 2] ---------------------------

REWARDS = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0, 2.0])


def test_grpo_normalises_by_group_mean_and_unbiased_std():
    # group 1: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = 1/sqrt(3)
    #   -> (2/3) sqrt(3) = 2/sqrt(3), -(1/3) sqrt(3) = -1/sqrt(3)
    # group 2: mean 2, unbiased std sqrt((1 + 1 + 0) / 2) = 1 -> [1, -1, 0]
    s3 = math.sqrt(3.0)
    close(compute_advantages("grpo", REWARDS, 3), [2 / s3, -1 / s3, -1 / s3, 1.0, -1.0, 0.0])


def test_grpo_group_with_equal_rewards_gets_zero_advantage():
    close(compute_advantages("grpo", torch.tensor([1.0, 1.0, 0.0, 0.0]), 2), [0.0, 0.0, 0.0, 0.0])


def test_drgrpo_only_subtracts_the_group_mean():
    # group 1: [1, 0, 0] - 1/3; group 2: [3, 1, 2] - 2
    close(compute_advantages("drgrpo", REWARDS, 3), [2 / 3, -1 / 3, -1 / 3, 1.0, -1.0, 0.0])


def test_rloo_baseline_is_the_mean_of_the_other_samples():
    # group 1: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5 (twice)
    # group 2: 3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0
    close(compute_advantages("rloo", REWARDS, 3), [1.0, -0.5, -0.5, 1.5, -1.5, 0.0])


def test_reinforce_pp_whitens_over_the_whole_batch_not_the_groups():
    # rewards [0, 0, 1, 1]: batch mean 0.5, unbiased var 4 * 0.25 / 3 = 1/3 -> std 1/sqrt(3)
    # A = +-0.5 * sqrt(3); per group (n=2) every group is constant, so GRPO would give zeros
    half_s3 = 0.5 * math.sqrt(3.0)
    close(
        compute_advantages("reinforce_pp", torch.tensor([0.0, 0.0, 1.0, 1.0]), 2),
        [-half_s3, -half_s3, half_s3, half_s3],
    )


def test_advantages_are_detached_and_float():
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not compute_advantages("grpo", rewards, 2).requires_grad
    assert compute_advantages("rloo", torch.tensor([1, 0]), 2).dtype == torch.float32


@pytest.mark.parametrize(
    "args, match",
    [
        (("ppo", REWARDS, 3), "algorithm.advantage"),
        (("grpo", REWARDS, 4), "group_size=4"),
        (("rloo", REWARDS, 1), "rollout.n >= 2"),
        (("grpo", REWARDS.view(2, 3), 3), r"shape \[B\]"),
    ],
)
def test_advantages_bad_input_names_the_fix(args, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(*args)


# -- loss aggregation --------------------------------------------------------------------------

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_mean", (1 + 2 + 3 + 4) / 4),  # 4 real tokens
        ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2),  # per-sequence means, then mean over 2 seqs
        ("seq_mean_token_sum_norm", (6 / 4 + 4 / 4) / 2),  # per-sequence sums / max_len=4, mean over seqs
    ],
)
def test_loss_agg_modes_by_hand(mode, expected):
    close(LossAgg(mode, global_tokens=4, global_seqs=2, max_len=4)(PER_TOKEN, MASK), expected)


def test_loss_agg_bad_input():
    with pytest.raises(ValueError, match="algorithm.loss_agg"):
        LossAgg("mean", 1, 1, 1)
    with pytest.raises(ValueError, match="rollout.max_tokens"):
        LossAgg("token_mean", 1, 1, 0)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        LossAgg("token_mean", 1, 1, 1)(PER_TOKEN, MASK[:, :2])


def _random_batch(seed, num_seqs=12, max_len=7):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (num_seqs,), generator=gen)
    lengths[0] = max_len
    mask = (torch.arange(max_len) < lengths[:, None]).float()
    logp = -torch.rand(num_seqs, max_len, generator=gen) * 2
    old_logp = logp + 0.4 * torch.randn(num_seqs, max_len, generator=gen)
    advantages = torch.randn(num_seqs, generator=gen)
    weights = torch.rand(num_seqs, max_len, generator=gen) * 2
    return logp, old_logp, advantages, mask, weights


def _loss_and_grad(name, mode, logp, old_logp, advantages, mask, weights, parts):
    """Sum of the loss contributions over ``parts`` (row-index lists), and d(sum)/d(logp)."""
    leaf = logp.clone().requires_grad_(True)
    agg = LossAgg(mode, global_tokens=float(mask.sum()), global_seqs=mask.shape[0], max_len=mask.shape[1])
    total = torch.zeros(())
    for part in parts:
        rows = torch.tensor(part)
        loss, _ = policy_loss(
            name,
            leaf[rows],
            old_logp[rows],
            advantages[rows],
            mask[rows],
            clip_low=0.2,
            clip_high=0.28,
            dual_clip=3.0,
            weights=weights[rows],
            agg=agg,
        )
        loss.backward()  # gradient accumulation, as over micro-batches (and an all-reduce SUM over ranks)
        total = total + loss.detach()
    return total, leaf.grad


@pytest.mark.parametrize("name", ["ppo", "gspo"])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_loss_contributions_over_any_split_equal_the_full_batch(name, mode):
    batch = _random_batch(seed=7)
    full_loss, full_grad = _loss_and_grad(name, mode, *batch, parts=[list(range(12))])
    # "2 ranks x uneven micro-batches", rows shuffled, one part of a single sequence
    split = [[11, 3, 5], [0], [7, 1, 9, 2], [4, 6, 8, 10]]
    split_loss, split_grad = _loss_and_grad(name, mode, *batch, parts=split)
    close(split_loss, full_loss, atol=1e-6)
    close(split_grad, full_grad, atol=1e-7)
    assert full_grad.abs().sum() > 0


def test_averaging_per_micro_batch_means_would_differ():
    # guards the test above: a naive mean of micro-batch means is not split-invariant
    per_token, mask = PER_TOKEN, MASK
    naive = (per_token[0, :3].mean() + per_token[1, :1].mean()) / 2  # (2 + 4) / 2 = 3
    correct = LossAgg("token_mean", 4, 2, 4)(per_token[:1], mask[:1]) + LossAgg("token_mean", 4, 2, 4)(
        per_token[1:], mask[1:]
    )  # (6 + 4) / 4 = 2.5
    close(naive, 3.0)
    close(correct, 2.5)


# -- PPO-clip ----------------------------------------------------------------------------------
# ratios [0.5, 0.9, 1.1, 1.5], clip_low 0.2 / clip_high 0.28 -> clip range [0.8, 1.28]
RATIOS = torch.tensor([0.5, 0.9, 1.1, 1.5])


def _ppo_case(advantages, dual_clip=0.0, clip_high=0.28, weights=None):
    logp = RATIOS.log().repeat(len(advantages), 1).requires_grad_(True)
    mask = torch.ones_like(logp)
    agg = LossAgg("token_mean", global_tokens=mask.numel(), global_seqs=len(advantages), max_len=4)
    loss, metrics = policy_loss(
        "ppo",
        logp,
        torch.zeros_like(logp),
        torch.tensor(advantages),
        mask,
        clip_low=0.2,
        clip_high=clip_high,
        dual_clip=dual_clip,
        weights=weights,
        agg=agg,
    )
    loss.backward()
    return loss, metrics, logp.grad


def test_ppo_positive_advantage_clips_high_ratios():
    # A=+1: max(-r, -clip(r)) = [-0.5, -0.9, -1.1, max(-1.5, -1.28) = -1.28]; mean = -3.78 / 4
    loss, metrics, grad = _ppo_case([1.0])
    close(loss, -3.78 / 4)
    close(metrics["clip_frac"], 0.25)
    close(metrics["clip_frac_high"], 0.25)
    close(metrics["ratio_mean"], (0.5 + 0.9 + 1.1 + 1.5) / 4)
    # d/dlogp of -A r / 4 is -r / 4 where unclipped, 0 where clipped
    close(grad, [[-0.5 / 4, -0.9 / 4, -1.1 / 4, 0.0]])


def test_ppo_negative_advantage_clips_low_ratios():
    # A=-1: max(r, clip(r)) = [max(0.5, 0.8) = 0.8, 0.9, 1.1, 1.5]; mean = 4.3 / 4
    loss, metrics, grad = _ppo_case([-1.0])
    close(loss, 4.3 / 4)
    close(metrics["clip_frac_low"], 0.25)
    close(grad, [[0.0, 0.9 / 4, 1.1 / 4, 1.5 / 4]])


def test_ppo_dual_clip_bounds_negative_advantage_loss():
    # A=[+1, -1], dual clip c=1.4: row 2 token r=1.5 -> min(1.5, 1.4) = 1.4 (and no gradient)
    # token mean over 8: (-3.78 + 0.8 + 0.9 + 1.1 + 1.4) / 8 = 0.42 / 8
    loss, metrics, grad = _ppo_case([1.0, -1.0], dual_clip=1.4)
    close(loss, 0.42 / 8)
    close(metrics["dual_clip_frac"], 1 / 8)
    close(metrics["clip_frac"], 2 / 8)
    close(grad, [[-0.5 / 8, -0.9 / 8, -1.1 / 8, 0.0], [0.0, 0.9 / 8, 1.1 / 8, 0.0]])


def test_ppo_dual_clip_leaves_positive_advantages_alone():
    loss, metrics, _ = _ppo_case([1.0], dual_clip=1.01)
    close(loss, -3.78 / 4)
    assert metrics["dual_clip_frac"] == 0.0


def test_clip_higher_lets_ratios_above_symmetric_range_through():
    # ratio 1.1 with clip_high 0.05 is clipped to 1.05: [-0.5, -0.9, -1.05, -1.05] / 4 ...
    loss, metrics, _ = _ppo_case([1.0], clip_high=0.05)
    close(loss, (-0.5 - 0.9 - 1.05 - 1.05) / 4)
    close(metrics["clip_frac"], 0.5)


def test_ppo_weights_multiply_the_per_token_loss():
    # A=+1 row [-0.5, -0.9, -1.1, -1.28] times weights [2, 1, 0, 1] -> (-1.0 - 0.9 - 1.28) / 4
    loss, _, grad = _ppo_case([1.0], weights=torch.tensor([[2.0, 1.0, 0.0, 1.0]]))
    close(loss, (-1.0 - 0.9 - 1.28) / 4)
    close(grad, [[-1.0 / 4, -0.9 / 4, 0.0, 0.0]])


def test_policy_loss_bad_input():
    x, agg = torch.zeros(2, 3), LossAgg("token_mean", 6, 2, 3)
    kwargs = dict(clip_low=0.2, clip_high=0.2, agg=agg)
    with pytest.raises(ValueError, match="algorithm.policy_loss"):
        policy_loss("grpo", x, x, torch.zeros(2), x, **kwargs)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss("ppo", x, x, torch.zeros(3), x, **kwargs)
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss("ppo", x, torch.zeros(2, 4), torch.zeros(2), x, **kwargs)
    with pytest.raises(ValueError, match="algorithm.dual_clip"):
        policy_loss("ppo", x, x, torch.zeros(2), x, dual_clip=0.5, **kwargs)


# -- GSPO --------------------------------------------------------------------------------------


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    # row 0: log-ratios [0.2, 0.0] -> s = exp(0.1) = 1.105171 > 1.05 -> A=+1 loss per token -1.05 (clipped)
    # row 1: log-ratios [-0.02, pad] -> s = exp(-0.02) = 0.980199 in [0.95, 1.05] -> A=-1 loss 0.980199
    # seq_mean_token_mean: (-1.05 + 0.980199) / 2
    old_logp = torch.tensor([[-1.0, -2.0], [-1.0, 50.0]])
    logp = (old_logp + torch.tensor([[0.2, 0.0], [-0.02, -9.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    agg = LossAgg("seq_mean_token_mean", global_tokens=3, global_seqs=2, max_len=2)
    loss, metrics = policy_loss(
        "gspo", logp, old_logp, torch.tensor([1.0, -1.0]), mask, clip_low=0.05, clip_high=0.05, agg=agg
    )
    loss.backward()
    close(loss, (-1.05 + math.exp(-0.02)) / 2)
    close(metrics["clip_frac"], 2 / 3)  # both tokens of row 0, of 3 real tokens
    # row 0 clipped -> no gradient; row 1: d(s)/d(logp_10) = s / L_1 = s, divided by G = 2
    close(logp.grad, [[0.0, 0.0], [math.exp(-0.02) / 2, 0.0]])


def test_gspo_gradient_equals_the_sequence_level_objective():
    # inside the clip range, GSPO's gradient is that of -(1/G) sum_i A_i s_i with s_i computed directly
    logp, old_logp, advantages, mask, _ = _random_batch(seed=3)
    old_logp = logp + 0.01 * (old_logp - logp)  # small ratios: nothing clips
    leaf = logp.clone().requires_grad_(True)
    agg = LossAgg("seq_mean_token_mean", float(mask.sum()), mask.shape[0], mask.shape[1])
    loss, metrics = policy_loss("gspo", leaf, old_logp, advantages, mask, clip_low=0.5, clip_high=0.5, agg=agg)
    loss.backward()
    reference = logp.clone().requires_grad_(True)
    seq_ratio = torch.exp(((reference - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    has_tokens = (mask.sum(-1) > 0).float()
    (-(advantages * seq_ratio * has_tokens).sum() / mask.shape[0]).backward()
    assert metrics["clip_frac"] == 0.0
    close(leaf.grad, reference.grad, atol=1e-6)


# -- KL ----------------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    # x = logp - ref = [ln 2, 0, -ln 2]
    logp = torch.log(torch.tensor([0.5, 0.3, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.3, 0.5]))
    close(kl_estimate(logp, ref, "k1"), [LN2, 0.0, -LN2])
    close(kl_estimate(logp, ref, "k2"), [0.5 * LN2**2, 0.0, 0.5 * LN2**2])
    # k3 = exp(-x) + x - 1: [0.5 + ln2 - 1, 0, 2 - ln2 - 1]
    close(kl_estimate(logp, ref, "k3"), [LN2 - 0.5, 0.0, 1.0 - LN2])


def test_kl_bad_estimator():
    with pytest.raises(ValueError, match="algorithm.kl_estimator"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


def test_kl_in_reward_subtracts_summed_kl_of_real_tokens():
    # row 0: k1 = ln2 + 0 -> 1 - 0.1 ln2; row 1: only the first token is real: k1 = -ln2 -> 0 + 0.1 ln2
    logp = torch.log(torch.tensor([[0.5, 0.3], [0.25, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.3], [0.5, 0.1]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = kl_penalized_rewards(torch.tensor([1.0, 0.0]), logp.requires_grad_(True), ref, mask, 0.1, "k1")
    close(out, [1.0 - 0.1 * LN2, 0.1 * LN2])
    assert not out.requires_grad


# -- entropy -----------------------------------------------------------------------------------


def test_entropy_from_logits_by_hand():
    # uniform over 4 -> ln 4; logits [0, ln 3] -> probs [1/4, 3/4] -> -(1/4 ln 1/4 + 3/4 ln 3/4)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, LN3, -1e9, -1e9]]])
    expected = [[math.log(4.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]]
    close(entropy_from_logits(logits), expected)


def test_entropy_bonus_is_the_aggregated_entropy():
    entropy = torch.tensor([[1.0, 3.0], [2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    close(entropy_bonus(entropy, mask, LossAgg("token_mean", 3, 2, 2)), (1 + 3 + 2) / 3)


# -- rollout correction ------------------------------------------------------------------------
# d = old - rollout = [[ln 3, -ln 4, ln 1.5, pad], [ln 3, 0, pad, pad]]
D = torch.tensor([[LN3, -math.log(4.0), math.log(1.5), 7.0], [LN3, 0.0, -7.0, 7.0]])
C_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
ROLLOUT = torch.full((2, 4), -1.0)


def _correct(method, level, **kwargs):
    params = dict(tis_cap=2.0, icepop_low=0.5, icepop_high=2.0) | kwargs
    return rollout_correction(ROLLOUT + D, ROLLOUT, C_MASK, method=method, level=level, **params)


def test_mismatch_metrics_are_reported_without_correction():
    weights, metrics = _correct("none", "token")
    assert weights is None
    # |d| over 5 real tokens: (ln3 + ln4 + ln1.5 + ln3 + 0) / 5 = ln(54) / 5
    close(metrics["logprob_diff_mean"], math.log(54.0) / 5)
    # k3 of rollout vs train: exp(d) - d - 1 per token
    # (3 - ln3 - 1) + (1/4 + ln4 - 1) + (1.5 - ln1.5 - 1) + (3 - ln3 - 1) + 0
    #   = 3.75 - ln(3 * 1.5 * 3 / 4) = 3.75 - ln(3.375)
    close(metrics["logprob_k3"], (3.75 - math.log(3.375)) / 5)
    # raw token weights [3, 1/4, 1.5 | 3, 1] -> 8.75 / 5
    close(metrics["is_weight_mean"], 8.75 / 5)
    # |p_old - p_rollout| with p_rollout = e^-1 and p_old = e^-1 * w: e^-1 * (2 + 3/4 + 1/2 + 2 + 0) / 5
    close(metrics["prob_diff_mean"], math.exp(-1.0) * 5.25 / 5)


def test_tis_token_level_truncates_weights():
    weights, metrics = _correct("tis", "token")
    close(weights * C_MASK, [[2.0, 0.25, 1.5, 0.0], [2.0, 1.0, 0.0, 0.0]])
    close(metrics["tis_clip_frac"], 2 / 5)


def test_icepop_token_level_zeroes_weights_outside_the_band():
    weights, metrics = _correct("icepop", "token")
    # [3, 1/4, 1.5 | 3, 1] with band [0.5, 2] -> [0, 0, 1.5 | 0, 1]
    close(weights * C_MASK, [[0.0, 0.0, 1.5, 0.0], [0.0, 1.0, 0.0, 0.0]])
    close(metrics["icepop_mask_frac"], 3 / 5)


def test_sequence_level_uses_the_product_of_token_ratios():
    # row 0: 3 * 1/4 * 1.5 = 1.125; row 1: 3 * 1 = 3 (pads ignored)
    weights, metrics = _correct("tis", "sequence")
    close(weights * C_MASK, [[1.125] * 3 + [0.0], [2.0, 2.0, 0.0, 0.0]])
    close(metrics["tis_clip_frac"], 2 / 5)  # both real tokens of row 1
    close(metrics["is_weight_mean"], (3 * 1.125 + 2 * 3) / 5)
    weights, metrics = _correct("icepop", "sequence")
    close(weights * C_MASK, [[1.125] * 3 + [0.0], [0.0] * 4])
    close(metrics["icepop_mask_frac"], 2 / 5)


def test_bypass_gives_no_weights_and_anchors_the_ratio_on_the_rollout_logprobs():
    from rlx.trainer.algorithms.correction import ratio_anchor

    weights, metrics = _correct("bypass", "token")
    assert weights is None
    close(metrics["is_weight_mean"], 8.75 / 5)  # the mismatch is still reported
    old = ROLLOUT + D
    assert ratio_anchor("bypass", old, ROLLOUT) is ROLLOUT
    for method in ("none", "tis", "icepop"):
        assert ratio_anchor(method, old, ROLLOUT) is old


def test_correction_weights_are_detached():
    old = (ROLLOUT + D).requires_grad_(True)
    weights, _ = rollout_correction(
        old, ROLLOUT, C_MASK, method="tis", level="token", tis_cap=2.0, icepop_low=0.5, icepop_high=2.0
    )
    assert not weights.requires_grad


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="is", level="token"), "algorithm.rollout_correction"),
        (dict(method="tis", level="chunk"), "algorithm.correction_level"),
        (dict(method="icepop", level="token", icepop_low=2.0), "algorithm.icepop_low"),
    ],
)
def test_correction_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _correct(**kwargs)
    with pytest.raises(ValueError, match="rollout engine returns one logprob per token"):
        rollout_correction(
            D, ROLLOUT[:, :2], C_MASK, method="none", level="token", tis_cap=2.0, icepop_low=0.5, icepop_high=2.0
        )
