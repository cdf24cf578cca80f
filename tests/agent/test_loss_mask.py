"""An episode's row: the loss and its gradient reach the policy's tokens only, never the observations."""

from __future__ import annotations

import pytest
import torch

from rlx.agent.episode import Episode, Turn
from rlx.trainer.algorithms.aggregation import AGG_MODES, LossAgg
from rlx.trainer.algorithms.policy_loss import policy_loss
from rlx.trainer.batch import build_batch


def episodes() -> list[Episode]:
    return [
        Episode(
            prompt_ids=[5, 6, 7],
            turns=[Turn([10, 11, 12], [-0.1, -0.2, -0.3], observation_ids=[40, 41]), Turn([13, 2], [-0.4, -0.5])],
        ),
        Episode(prompt_ids=[8], turns=[Turn([14], [-0.6], observation_ids=[42, 43, 44]), Turn([2], [-0.7])]),
    ]


def test_rows_mask_exactly_the_policy_tokens():
    rows = [e.row() for e in episodes()]
    batch = build_batch(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [1.0, 0.0],
        0,
        token_masks=[r[3] for r in rows],
    )
    assert batch.completion_ids.tolist() == [[10, 11, 12, 40, 41, 13, 2], [14, 42, 43, 44, 2, 0, 0]]
    assert batch.mask.tolist() == [[1, 1, 1, 0, 0, 1, 1], [1, 0, 0, 0, 1, 0, 0]]
    assert batch.rollout_logp[0].tolist() == pytest.approx([-0.1, -0.2, -0.3, 0, 0, -0.4, -0.5])
    assert batch.attention_mask.tolist() == [[1] * 10, [0, 0, 1, 1, 1, 1, 1, 1, 0, 0]]
    with pytest.raises(ValueError, match="logprobs"):
        Episode([1], [Turn([3, 4], [-0.1])]).row()


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("loss", ["ppo", "gspo"])
def test_no_gradient_reaches_observation_tokens(loss, agg_mode):
    rows = [e.row() for e in episodes()]
    batch = build_batch(
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [1.0, 0.0],
        0,
        token_masks=[r[3] for r in rows],
    )
    logp = (batch.rollout_logp + 0.05 * torch.randn_like(batch.rollout_logp)).requires_grad_(True)
    agg = LossAgg(agg_mode, global_tokens=float(batch.mask.sum()), global_seqs=2.0, max_len=8)
    value, _ = policy_loss(
        loss, logp, batch.rollout_logp, torch.tensor([1.0, -1.0]), batch.mask, clip_low=0.2, clip_high=0.28, agg=agg
    )
    value.backward()
    assert torch.all(logp.grad[batch.mask == 0] == 0)
    assert torch.all(logp.grad[batch.mask == 1] != 0)
