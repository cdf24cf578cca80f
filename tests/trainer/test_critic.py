"""PPO with a critic: GAE against a hand computation, the critic's warm-up and checkpoint round trip, and a
real `rlx train` run with algorithm.advantage=gae."""

import json

import pytest
import torch

from rlx.config.algorithm import AlgorithmConfig
from rlx.config.model import ModelConfig
from rlx.config.roles import trainer_role
from rlx.config.schema import RunConfig
from rlx.config.trainer import TrainerConfig
from rlx.trainer.algorithms.gae import gae_advantages
from rlx.trainer.critic import OPTIMIZER_FILE, STATE_FILE, VALUE_FILE
from rlx.trainer.trainer import Trainer
from tests.helpers import start_rlx, stop_group, write_config
from tests.trainer.test_trainer_step import ragged_batch

REWARDS = torch.tensor([1.0, 0.0])
VALUES = torch.tensor([[0.5, 0.2, 0.1], [0.3, -0.1, 7.0]])  # 7.0 sits on padding: it must not count
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_gae_matches_a_hand_computation():
    advantages, returns = gae_advantages(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8, whiten=False)
    # row 0: deltas -0.32, -0.11, 0.9 (reward on the last token); A_t = delta_t + 0.72 * A_{t+1}
    # row 1: deltas 0.9 * -0.1 - 0.3 = -0.39, 0 - (-0.1) = 0.1 (the value after the last token is 0)
    expected = torch.tensor([[-0.32 + 0.72 * 0.538, -0.11 + 0.72 * 0.9, 0.9], [-0.39 + 0.72 * 0.1, 0.1, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, (expected + VALUES) * MASK)


def test_gae_with_gamma_and_lambda_one_is_the_reward_minus_the_value_and_whitens_over_real_tokens():
    advantages, _ = gae_advantages(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(advantages, (REWARDS[:, None] - VALUES) * MASK)
    whitened, _ = gae_advantages(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    real = whitened[MASK.bool()]
    assert abs(float(real.mean())) < 1e-6 and float(real.std()) == pytest.approx(1.0, abs=1e-5)
    assert float(whitened[1, 2]) == 0.0


def gae_trainer(model_dir, **algorithm):
    torch.manual_seed(0)
    cfg = RunConfig(
        model=ModelConfig(path=str(model_dir)),
        algorithm=AlgorithmConfig(advantage="gae", **algorithm),
        trainer=TrainerConfig(micro_batch_size=6, device="cpu", lr=1e-3),
    )
    cfg.rollout.n = 4
    return Trainer(trainer_role(cfg))


def test_critic_warmup_then_policy_and_checkpoint_round_trip(tiny_model_dir, tmp_path):
    trainer = gae_trainer(tiny_model_dir, critic_warmup_steps=1)
    batch = ragged_batch()
    before = {name: t.clone() for name, t in trainer.named_tensors()}
    first = trainer.step(batch)
    assert {"critic_explained_variance", "value_loss", "value_mean"} <= first.keys()
    assert first["value_mean"] == 0.0 and first["value_loss"] > 0  # a zero-initialised head, then it learns
    assert all(torch.equal(t, before[name]) for name, t in trainer.named_tensors())  # warm-up: policy untouched
    second = trainer.step(batch)
    assert "clip_frac" in second and second["value_mean"] != 0.0
    assert any(not torch.equal(t, before[name]) for name, t in trainer.named_tensors())

    trainer.save_extra(tmp_path)
    assert all((tmp_path / name).is_file() for name in (VALUE_FILE, OPTIMIZER_FILE, STATE_FILE))
    restored = gae_trainer(tiny_model_dir, critic_warmup_steps=1)
    restored.load_extra(tmp_path)
    assert restored.critic.steps == 2 and not restored.critic.warming_up
    for (name, a), (_, b) in zip(
        trainer.critic.model.state_dict().items(), restored.critic.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    third, again = trainer.critic, restored.critic  # the critic's next step depends only on its own state
    for critic in (third, again):
        critic.advantages(batch.mask, batch.rewards, [mb for mb in _micro(trainer, batch)])
    assert third.update(_micro(trainer, batch)) == again.update(_micro(restored, batch))
    for (name, a), (_, b) in zip(third.model.state_dict().items(), again.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def _micro(trainer, batch):
    from rlx.trainer.packing import micro_batches

    t = trainer.cfg.trainer
    return micro_batches(batch, 0, 1, t.micro_batch_tokens, t.micro_batch_size)


def test_gae_is_refused_with_several_ranks():
    from rlx.config.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer.num_ranks=1"):
        RunConfig(
            model=ModelConfig(path="m"), algorithm=AlgorithmConfig(advantage="gae"), trainer=TrainerConfig(num_ranks=2)
        )


def test_a_two_step_gae_run_logs_the_critic_and_checkpoints_it(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "gae.yaml",
        tiny_model_dir,
        rollout={"backend": "hf", "n": 4, "max_tokens": 6},
        algorithm={"advantage": "gae", "critic_warmup_steps": 1},
        trainer={"total_steps": 2, "prompts_per_step": 4, "eval_every": 0, "output_dir": str(run_dir)},
        task={"num_eval": 8},
    )
    proc = start_rlx(["train", str(config)], tmp_path / "train.log")
    try:
        assert proc.wait(300) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        stop_group(proc)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 1]
    assert len(steps) == 2 and all("critic_explained_variance" in r and "value_loss" in r for r in steps)
    assert "clip_frac" not in steps[0] and "clip_frac" in steps[1]  # step 1 trains only the critic
    ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    listed = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert {VALUE_FILE, OPTIMIZER_FILE, STATE_FILE} <= set(listed)
