"""The ``trainer`` section: optimisation, ranks and the step loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx.config.checks import MIN_TEMPERATURE, check_choice, check_finite, check_range
from rlx.config.errors import ConfigError
from rlx.config.megatron import TRAINER_BACKENDS, MegatronConfig


@dataclass
class TrainerConfig:
    mode: str = "sync"
    """sync (on-policy, lock-step), one_step_off (generation of step k+1 overlaps training of step k) or
    fully_async (generation never stops; partial rollouts across weight updates; see max_staleness)."""
    max_staleness: int = 1
    """fully_async: most policy versions a trained sample's oldest token may lag the trainer; older groups are
    dropped and their prompts generated again. Also bounds generation ahead: (max_staleness + 1) steps."""
    num_ranks: int = 1
    """Trainer processes (torch.distributed ranks); > 1 shards the model with FSDP2."""
    backend: str = "fsdp2"
    """What trains the policy: fsdp2 (the transformers model, FSDP2 over several ranks) or megatron
    (megatron-core's GPTModel with the parallel layout of trainer.megatron; docs/train.md)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """trainer.backend=megatron: tensor, pipeline and context parallel sizes, the distributed optimizer."""
    data_plane: str = "store"
    """How ranks > 0 get a step's batch: store (each pulls its own rows from the sample store; rank 0 sends a
    fixed-size notice) or broadcast (rank 0 broadcasts every tensor to every rank)."""
    device: str = "auto"
    """Training device: auto (cuda when available), cpu or cuda."""
    cpu_threads: int = 0
    """Training on a CPU: intra-op threads per rank (torch.set_num_threads); 0 = torch's default, one per core.
    A model too small to split its matrix products well runs faster on fewer (see configs/quickstart.yaml)."""
    total_steps: int = 20
    """RL steps to run."""
    prompts_per_step: int = 16
    """Prompts per step; each yields rollout.n samples."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass on one rank (gradient accumulation over the rest)."""
    micro_batch_tokens: int = 16384
    """Tokens per packed forward/backward pass on one rank (no padding); 0 = micro_batch_size padded rows."""
    share_prompts: bool = True
    """In packed micro-batches, a group's samples with the same prompt carry it once: the prompt goes through
    the model once and each completion attends to it (the same logprobs and gradients, less work). The FSDP2
    backend only: trainer.backend=megatron runs padded rows, each with its own prompt, and plans its
    micro-batches by those tokens."""
    skip_no_signal: bool = True
    """Leave a group whose advantages are all zero (every reward of the prompt equal) out of the update's
    forward and backward when only the policy loss reads it (no KL, entropy bonus, critic or teacher): its loss
    and gradient are zero, and the loss still counts its tokens, so the update is the same with less work. The
    update's metrics (entropy, clip fractions) then cover the trained groups; ``groups_no_signal`` is the
    fraction left out."""
    epochs_per_step: int = 1
    """Passes over each step's samples (PPO epochs)."""
    lr: float = 1e-5
    """Peak learning rate of AdamW."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of trainer.lr (cosine schedule)."""
    lr_schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant or cosine."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 = off."""
    max_nonfinite_steps: int = 3
    """Steps in a row whose loss or gradient norm is NaN or inf after which the run stops with an error. Each such
    step is skipped (no optimizer update, the weights unchanged; metric skipped_nonfinite), so no checkpoint holds
    NaN."""
    fused_kernels: str = "auto"
    """Liger's fused RMSNorm and SwiGLU kernels on the trainer's model (CUDA, liger-kernel installed, Llama /
    Mistral / Qwen2 / Qwen3): auto = where they apply, on = required, off = never (rlx.trainer.kernels)."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk when computing logprobs/entropy, bounding the logits held at once."""
    eval_every: int = 5
    """Evaluate held-out accuracy every this many steps (and at start and end); 0 = off."""
    eval_temperature: float = 0.0
    """Held-out evaluation's sampling temperature: 0 = greedy; > 0 = one sample per held-out problem at this
    temperature, each problem's seed the same at every evaluation (the accuracy of the policy as it samples)."""
    seed: int = 0
    """Seed of sampling, data order and initialisation."""
    output_dir: str = "runs/${run_name}"
    """Run directory: checkpoints, metrics, traces, logs."""
    resume: bool = False
    """Continue from the newest complete checkpoint in the run directory."""

    def __post_init__(self) -> None:
        check_choice("trainer.mode", self.mode, ("sync", "one_step_off", "fully_async"))
        check_range("trainer.max_staleness", self.max_staleness, 0, hint="0 trains only on the newest weights' samples")
        check_choice("trainer.device", self.device, ("auto", "cpu", "cuda"))
        check_choice("trainer.lr_schedule", self.lr_schedule, ("constant", "cosine"))
        check_range("trainer.num_ranks", self.num_ranks, 1)
        check_choice("trainer.backend", self.backend, TRAINER_BACKENDS)
        check_choice("trainer.data_plane", self.data_plane, ("store", "broadcast"))
        check_range("trainer.total_steps", self.total_steps, 1)
        check_range("trainer.prompts_per_step", self.prompts_per_step, 1)
        check_range("trainer.micro_batch_size", self.micro_batch_size, 1)
        check_range("trainer.cpu_threads", self.cpu_threads, 0)
        check_range("trainer.micro_batch_tokens", self.micro_batch_tokens, 0)
        check_range("trainer.epochs_per_step", self.epochs_per_step, 1)
        check_range("trainer.lr", self.lr, 0.0)
        check_range("trainer.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_range("trainer.weight_decay", self.weight_decay, 0.0)
        check_range("trainer.max_grad_norm", self.max_grad_norm, 0.0, hint="0 turns clipping off")
        check_range(
            "trainer.max_nonfinite_steps",
            self.max_nonfinite_steps,
            1,
            hint="1 stops the run at the first step whose loss or gradient norm is NaN or inf",
        )
        check_range("trainer.warmup_steps", self.warmup_steps, 0)
        check_range("trainer.logprob_chunk_size", self.logprob_chunk_size, 1)
        check_choice("trainer.fused_kernels", self.fused_kernels, ("auto", "on", "off"))
        if self.fused_kernels == "on" and self.device == "cpu":
            raise ConfigError(
                "trainer.fused_kernels=on with trainer.device=cpu: the fused kernels are CUDA (Triton) "
                "only; set trainer.fused_kernels=auto or off"
            )
        check_range("trainer.eval_every", self.eval_every, 0)
        check_range("trainer.eval_temperature", self.eval_temperature, 0.0)
        if 0.0 < self.eval_temperature < MIN_TEMPERATURE:
            raise ConfigError(
                f"trainer.eval_temperature={self.eval_temperature!r} is below {MIN_TEMPERATURE}; set 0 for greedy "
                f"evaluation or a value >= {MIN_TEMPERATURE}"
            )
        check_finite("trainer.betas", self.betas)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"trainer.betas={self.betas} must be two values in [0, 1), e.g. [0.9, 0.999]")
