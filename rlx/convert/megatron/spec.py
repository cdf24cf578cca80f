"""The shape of a Llama / Qwen2 / Qwen3 model, read from its Hugging Face config.json.

Everything the weight mapping and megatron-core's GPTModel need: layer count, head layout
(query groups), FFN size, vocabulary (and its padded size in Megatron), tied embeddings, QKV
bias (Qwen2) and Q/K norms (Qwen3). Configs that the mapping would get wrong (biases on the
output projection or MLP, MoE) are refused here, before anything is read.

Left out: RoPE scaling and other settings that change the forward pass but not the weights;
Megatron-LM takes those from its own arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.convert.errors import ConvertError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

FAMILIES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelSpec:
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def read_spec(config_path: Path, vocab_multiple: int) -> ModelSpec:
    """Read ``config.json``; ``vocab_multiple`` is Megatron's make-vocab-size-divisible-by x TP.

    The config goes through transformers' config class so that absent keys get that family's
    defaults (Qwen3's head_dim is 128 whatever hidden_size / num_heads is).
    """
    try:
        raw = json.loads(Path(config_path).read_bytes())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConvertError(
            f"cannot read the model config {config_path} ({exc}); pass the Hugging Face directory of this model"
        ) from None
    if not isinstance(raw, dict):
        raise ConvertError(
            f"the model config {config_path} holds a JSON {type(raw).__name__}, not an object; "
            "restore the model's config.json"
        )
    family = raw.get("model_type")
    experts = raw.get("num_experts") or raw.get("num_local_experts")
    if experts:
        raise ConvertError(
            f"{config_path}: model_type {family!r} is a mixture of experts ({experts} experts); the Megatron "
            "mapping covers dense layers only (no expert-parallel layout, no router). Train it with the FSDP2 "
            "backend and convert its checkpoints with --to hf"
        )
    if family not in FAMILIES:
        raise ConvertError(
            f"model_type {family!r} in {config_path} is not supported for Megatron "
            f"conversion; supported: {', '.join(FAMILIES)}"
        )
    _refuse_unsupported(raw, config_path)
    if vocab_multiple < 1:
        raise ConvertError(f"--vocab-multiple {vocab_multiple} must be >= 1")
    from transformers import AutoConfig

    return _spec_from_config(AutoConfig.for_model(**raw), family, vocab_multiple)


def _spec_from_config(config: PretrainedConfig, family: str, vocab_multiple: int) -> ModelSpec:
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise ConvertError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    rope = getattr(config, "rope_parameters", None) or {}
    return ModelSpec(
        family=family,
        num_layers=config.num_hidden_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=getattr(config, "head_dim", None) or hidden // heads,
        ffn_hidden_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        padded_vocab_size=-(-config.vocab_size // vocab_multiple) * vocab_multiple,
        tie_word_embeddings=bool(config.tie_word_embeddings),
        qkv_bias=family == "qwen2" or bool(getattr(config, "attention_bias", False)),
        qk_norm=family == "qwen3",
        norm_eps=float(config.rms_norm_eps),
        rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0)),
        max_position_embeddings=config.max_position_embeddings,
    )


def _refuse_unsupported(config: dict, config_path: Path) -> None:
    family = config["model_type"]
    if config.get("mlp_bias"):
        raise ConvertError(
            f"{config_path}: mlp_bias=true is not supported (megatron-core GPTModel has "
            "one bias switch for all linear layers)"
        )
    if family == "llama" and config.get("attention_bias"):
        raise ConvertError(
            f"{config_path}: Llama attention_bias=true puts a bias on o_proj, which the "
            "Megatron mapping does not carry; convert a model without it"
        )
