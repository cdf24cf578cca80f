"""Rank 0's RL loop: it drives the rollout servers, the rewards and the trainer ranks (runs in trainer rank 0).

- ``controller``: the loop: data -> generate -> reward -> logprobs / advantages -> update -> weight sync.
- ``fully_async``: ``trainer.mode=fully_async``: generation never stops; steps train on finished groups.
- ``colocation``: ``placement.mode=colocated``: trainer and engines take turns on the same GPUs.
- ``rollouts``: ``Rollouts``, what the loop asks of a step's samples, and ``make_rollouts``, which picks the collector.
- ``collector``: single-turn prompts -> a scored training batch; held-out accuracy.
- ``evaluate``: held-out metrics (accuracy, pass@k, maj@k), one function for `rlx train` and `rlx eval`.
- ``episodes``: multi-turn tasks: a step's episodes as a batch, and their greedy evaluation.
- ``episode_loop``: ``run_episode``: the policy and an environment take turns, as token ids.
- ``external``: ``task.name=external``'s collector: episodes an outside agent drove on the OpenAI endpoint.
- ``source``: where a step's samples come from: generated (through the filters), a dump, or both.
- ``filters``: DAPO's sampling filters over a step's groups.
"""
