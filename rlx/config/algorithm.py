"""The ``algorithm`` section (advantages, policy loss, KL, rollout correction) and its ``algorithm.distill``."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.checks import check_choice, check_range
from rlx.config.errors import ConfigError

TEACHER_BUILD_CHOICES = ("", "tiny_math_teacher")

ADVANTAGE_CHOICES = ("grpo", "drgrpo", "rloo", "reinforce_pp", "gae")
TEACHER_PLACEMENT_CHOICES = ("colocated", "served")


@dataclass
class DistillConfig:
    teacher: str = ""
    """The teacher (same tokenizer as model.path): a local Hugging Face directory, or a Hub id (ORG/NAME, pinned by an
    @REVISION suffix) that `rlx train` resolves once as it does model.path; empty = no distillation."""
    coef: float = 1.0
    """Weight of the per-token reverse-KL advantage coef * (teacher_logp - student_logp) on the sampled tokens."""
    reward_coef: float = 0.0
    """Weight of the task reward's advantage added to it; 0 = pure on-policy distillation."""
    teacher_build_if_missing: str = ""
    """If set and the teacher directory does not exist, `rlx train` builds it first: tiny_math_teacher (the
    quickstart's tiny model warm-started 4x longer, about 2 min on 2 CPU cores)."""
    teacher_placement: str = "colocated"
    """colocated (the teacher runs in the trainer process) or served (an `rlx rollout-serve` of the teacher)."""
    teacher_server: str = ""
    """teacher_placement=served: address (tcp://host:port or ipc://path) of the teacher's rollout server."""
    teacher_micro_batch: int = 64
    """colocated: sequences per teacher forward pass."""
    timeout_s: float = 120.0
    """served: deadline of one scoring request."""

    def __post_init__(self) -> None:
        check_choice("algorithm.distill.teacher_placement", self.teacher_placement, TEACHER_PLACEMENT_CHOICES)
        check_choice("algorithm.distill.teacher_build_if_missing", self.teacher_build_if_missing, TEACHER_BUILD_CHOICES)
        check_range("algorithm.distill.coef", self.coef, 0.0)
        check_range("algorithm.distill.reward_coef", self.reward_coef, 0.0)
        check_range("algorithm.distill.teacher_micro_batch", self.teacher_micro_batch, 1)
        check_range("algorithm.distill.timeout_s", self.timeout_s, 0.1)
        served = self.teacher and self.teacher_placement == "served"
        if served and not self.teacher_server.startswith(("tcp://", "ipc://")):
            raise ConfigError(
                f"algorithm.distill.teacher_server={self.teacher_server!r}: teacher_placement=served "
                "needs the address of a running `rlx rollout-serve` of the teacher (tcp:// or ipc://)"
            )


POLICY_LOSS_CHOICES = ("ppo", "gspo")
LOSS_AGG_CHOICES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_CHOICES = ("k1", "k2", "k3")
CORRECTION_CHOICES = ("none", "tis", "icepop", "bypass")
ROUTING_REPLAY_CHOICES = ("off", "record", "r3")


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"
    """Advantage estimator: grpo, drgrpo (no std normalisation), rloo, reinforce_pp or gae (PPO with a critic)."""
    policy_loss: str = "ppo"
    """Policy loss: ppo (token-level clipped ratio) or gspo (sequence-level ratio)."""
    clip_low: float = 0.2
    """Lower clip range: ratio >= 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip range: ratio <= 1 + clip_high (clip-higher when > clip_low)."""
    dual_clip: float = 0.0
    """Dual-clip bound c (> 1) for negative advantages; 0 = off."""
    loss_agg: str = "token_mean"
    """Loss aggregation: token_mean, seq_mean_token_mean or seq_mean_token_sum_norm."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference model; 0 = no reference model."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    kl_in_reward: bool = False
    """Apply the KL penalty to the reward instead of the loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    rollout_correction: str = "auto"
    """Off-policy correction with rollout logprobs: none, tis, icepop or bypass (PPO's ratio against the rollout
    logprobs, so the clip bounds each update from the weights that sampled a token); auto = none in sync, bypass
    otherwise."""
    correction_level: str = "token"
    """Where correction weights apply: token or sequence."""
    tis_cap: float = 2.0
    """TIS: importance weights are clamped to at most this."""
    icepop_low: float = 0.5
    """IcePop: weights below this are zeroed."""
    icepop_high: float = 2.0
    """IcePop: weights above this are zeroed."""
    gamma: float = 1.0
    """advantage=gae: discount per completion token."""
    lam: float = 0.95
    """advantage=gae: GAE lambda (1 = Monte-Carlo returns minus the value, 0 = one-step TD)."""
    value_clip: float = 0.2
    """advantage=gae: the critic's new values stay within +-value_clip of the old ones in the loss; 0 = off."""
    critic_warmup_steps: int = 0
    """advantage=gae: first steps in which only the critic trains (the policy is not updated)."""
    critic_lr: float = 0.0
    """advantage=gae: learning rate of the critic's AdamW; 0 = trainer.lr."""
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation from a teacher model (algorithm.distill.teacher)."""
    routing_replay: str = "off"
    """MoE models: off (the trainer routes each token itself), record (the engine returns each token's experts
    and the trainer reports route_disagreement, routing itself) or r3 (the trainer routes each token to the
    engine's experts, gate weights recomputed over them: rollout routing replay)."""

    def __post_init__(self) -> None:
        check_choice("algorithm.advantage", self.advantage, ADVANTAGE_CHOICES)
        check_choice("algorithm.policy_loss", self.policy_loss, POLICY_LOSS_CHOICES)
        check_choice("algorithm.loss_agg", self.loss_agg, LOSS_AGG_CHOICES)
        check_choice("algorithm.kl_estimator", self.kl_estimator, KL_CHOICES)
        check_choice("algorithm.rollout_correction", self.rollout_correction, ("auto",) + CORRECTION_CHOICES)
        check_choice("algorithm.correction_level", self.correction_level, ("token", "sequence"))
        check_choice("algorithm.routing_replay", self.routing_replay, ROUTING_REPLAY_CHOICES)
        check_range("algorithm.clip_low", self.clip_low, 0.0, 1.0)
        check_range("algorithm.clip_high", self.clip_high, 0.0)
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ConfigError(f"algorithm.dual_clip={self.dual_clip} must be > 1 (or 0 to turn it off)")
        check_range("algorithm.kl_coef", self.kl_coef, 0.0)
        check_range("algorithm.tis_cap", self.tis_cap, 1.0)
        check_range("algorithm.gamma", self.gamma, 0.0, 1.0)
        check_range("algorithm.lam", self.lam, 0.0, 1.0)
        check_range("algorithm.value_clip", self.value_clip, 0.0, hint="0 turns value clipping off")
        check_range("algorithm.critic_warmup_steps", self.critic_warmup_steps, 0)
        check_range("algorithm.critic_lr", self.critic_lr, 0.0, hint="0 uses trainer.lr")
        if not 0 <= self.icepop_low < 1 < self.icepop_high:
            raise ConfigError(
                f"algorithm.icepop_low={self.icepop_low}, icepop_high={self.icepop_high}: need 0 <= low < 1 < high"
            )
