"""The trainer ranks (rank 0 also runs ``rlx.orchestrator``'s loop; the others run ``ranks``).

- ``trainer``: the trainer role: scores a step's batch, advantages, the policy update.
- ``model``: loading the policy, reference and tokenizer; FSDP2 sharding. ``lora``: LoRA through peft.
- ``megatron/``: ``trainer.backend=megatron``: the policy on megatron-core's GPTModel (tensor parallel), which
  ``trainer`` runs in place of the FSDP2 model.
- ``batch``: the training batch; ``packing``: micro-batches per rank; ``attention``: packed attention.
- ``logprobs``: completion log-probabilities and entropy; ``kernels``: fused Triton kernels on CUDA.
- ``algorithms/``: advantages, policy losses, KL, rollout correction: one small function per file.
- ``optim``: AdamW and its schedule; ``critic``: PPO's value model; ``distill``: on-policy distillation.
- ``moe``: mixture-of-experts routing: rollout routing replay (R3) and the routes' disagreement.
- ``checkpoint``: save and restore; ``offload``: accelerator state to host memory and back (colocated).
- ``ranks``: the lock-step protocol of the other ranks; ``plane``: their share of a step's rows from the store.
- ``tiny`` / ``warmstart``: tiny models with a character-level tokenizer, and a task-warmed start.
- ``preflight``: what the ranks' inputs must satisfy before a run starts, and the builds of missing models.
"""
