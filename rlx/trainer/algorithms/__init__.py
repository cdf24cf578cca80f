"""RL algorithms as small, pure tensor functions: one concept per file.

- ``advantages``: dispatcher over ``grpo`` (and Dr.GRPO), ``rloo``, ``reinforce_pp``.
- ``policy_loss``: dispatcher over ``ppo`` (clip-higher, dual clip) and ``gspo``.
- ``aggregation``: ``LossAgg``, per-token loss -> this micro-batch's share of the global mean.
- ``kl``: k1/k2/k3 estimators of the KL to a reference model (as a loss or in the reward).
- ``entropy``: token entropy from logits and the entropy bonus.
- ``correction``: rollout correction (TIS, IcePop) and the train/rollout mismatch metrics.

Nothing here knows about models, ranks or configs: inputs are tensors, outputs are tensors
and float metrics. Import the function from its module (``from
rlx.trainer.algorithms.policy_loss import policy_loss``); this package re-exports nothing.
"""
