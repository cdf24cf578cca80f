"""The weight mapping between Hugging Face Llama / Qwen2 / Qwen3 and megatron-core's GPTModel.

One table of rules drives both directions. Each rule names one megatron-core tensor (with the
Transformer-Engine names that torch_dist checkpoints use), the Hugging Face tensors it is made
of, and how:

    copy     the same tensor
    qkv      q, k, v (weight or bias) fused and interleaved per query group:
             [q of group 0 (heads_per_group * head_dim rows), k of group 0, v of group 0, q of group 1, ...]
    gate_up  gate and up stacked: [gate; up] (megatron's linear_fc1 for SwiGLU)
    vocab    embedding / output rows, zero-padded to the padded vocabulary (and cut back)

Norms live in the linear layer that follows them (``linear_qkv.layer_norm_weight``,
``linear_fc1.layer_norm_weight``), as in Transformer-Engine layers. Both directions only move
rows around, so HF -> Megatron -> HF is bit-exact. Left out: MoE, MLA, biases outside QKV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlx.convert.errors import ConvertError
from rlx.convert.megatron.spec import ModelSpec

HF_LAYER = "model.layers.{i}."
MC_LAYER = "decoder.layers.{i}."

# Keys that the local (non-Transformer-Engine) layer spec uses for the two folded norms.
LOCAL_NORM_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


@dataclass(frozen=True)
class Rule:
    mcore: str
    hf: tuple[str, ...]
    kind: str = "copy"

    def at(self, layer: int) -> Rule:
        return Rule(self.mcore.format(i=layer), tuple(h.format(i=layer) for h in self.hf), self.kind)


def layer_rules(spec: ModelSpec) -> list[Rule]:
    """Rules for one transformer layer, with ``{i}`` for its index."""
    attn, mlp = HF_LAYER + "self_attn.", HF_LAYER + "mlp."
    rules = [
        Rule(MC_LAYER + "self_attention.linear_qkv.layer_norm_weight", (HF_LAYER + "input_layernorm.weight",)),
        Rule(MC_LAYER + "self_attention.linear_qkv.weight", tuple(attn + f"{p}_proj.weight" for p in "qkv"), "qkv"),
        Rule(MC_LAYER + "self_attention.linear_proj.weight", (attn + "o_proj.weight",)),
        Rule(MC_LAYER + "mlp.linear_fc1.layer_norm_weight", (HF_LAYER + "post_attention_layernorm.weight",)),
        Rule(MC_LAYER + "mlp.linear_fc1.weight", (mlp + "gate_proj.weight", mlp + "up_proj.weight"), "gate_up"),
        Rule(MC_LAYER + "mlp.linear_fc2.weight", (mlp + "down_proj.weight",)),
    ]
    if spec.qkv_bias:
        rules.insert(
            2, Rule(MC_LAYER + "self_attention.linear_qkv.bias", tuple(attn + f"{p}_proj.bias" for p in "qkv"), "qkv")
        )
    if spec.qk_norm:
        rules += [
            Rule(MC_LAYER + "self_attention.q_layernorm.weight", (attn + "q_norm.weight",)),
            Rule(MC_LAYER + "self_attention.k_layernorm.weight", (attn + "k_norm.weight",)),
        ]
    return rules


def all_rules(spec: ModelSpec) -> list[Rule]:
    """Every rule of the model, layers expanded, in Hugging Face order."""
    rules = [Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for layer in range(spec.num_layers):
        rules += [rule.at(layer) for rule in layer_rules(spec)]
    rules.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",)))
    if not spec.tie_word_embeddings:
        rules.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
    return rules


def to_mcore(rule: Rule, hf_tensors: list[torch.Tensor], spec: ModelSpec) -> torch.Tensor:
    if rule.kind == "qkv":
        return fuse_qkv(*hf_tensors, spec)
    if rule.kind == "gate_up":
        return torch.cat(hf_tensors, dim=0)
    if rule.kind == "vocab":
        return pad_vocab(hf_tensors[0], spec)
    return hf_tensors[0]


def to_hf(rule: Rule, tensor: torch.Tensor, spec: ModelSpec) -> list[torch.Tensor]:
    if rule.kind == "qkv":
        return list(split_qkv(tensor, spec))
    if rule.kind == "gate_up":
        return list(tensor.chunk(2, dim=0))
    if rule.kind == "vocab":
        return [tensor[: spec.vocab_size]]
    return [tensor]


def hf_shape(rule: Rule, index: int, mcore_shape: tuple[int, ...], spec: ModelSpec) -> tuple[int, ...]:
    """Shape of the ``index``-th Hugging Face tensor of ``rule`` (without reading any data)."""
    rows, rest = mcore_shape[0], tuple(mcore_shape[1:])
    if rule.kind == "qkv":
        q_rows = spec.num_heads * spec.head_dim
        return ((q_rows if index == 0 else spec.num_kv_heads * spec.head_dim),) + rest
    if rule.kind == "gate_up":
        return (rows // 2,) + rest
    if rule.kind == "vocab":
        return (spec.vocab_size,) + rest
    return tuple(mcore_shape)


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    groups, per, dim = spec.num_kv_heads, spec.heads_per_group, spec.head_dim
    rest = tuple(q.shape[1:])
    rows, want = (q.shape[0], k.shape[0], v.shape[0]), (groups * per * dim, groups * dim, groups * dim)
    if rows != want:
        raise ConvertError(
            f"q/k/v_proj have {rows} rows but config.json's heads and hidden_size give {want}; "
            "the config.json beside the weights does not describe them (restore the model's own)"
        )
    parts = [q.reshape(groups, per * dim, *rest), k.reshape(groups, dim, *rest), v.reshape(groups, dim, *rest)]
    return torch.cat(parts, dim=1).reshape(groups * (per + 2) * dim, *rest)


def split_qkv(qkv: torch.Tensor, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, per, dim = spec.num_kv_heads, spec.heads_per_group, spec.head_dim
    rest = tuple(qkv.shape[1:])
    if qkv.shape[0] != groups * (per + 2) * dim:
        raise ConvertError(
            f"linear_qkv has {qkv.shape[0]} rows but the config's heads give "
            f"{groups * (per + 2) * dim}; the --hf-config does not belong to this checkpoint"
        )
    grouped = qkv.reshape(groups, (per + 2) * dim, *rest)
    q, k, v = grouped.split([per * dim, dim, dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def split_qkv_into(qkv: torch.Tensor, spec: ModelSpec, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """``split_qkv`` written into ``out`` (q, k and v of their Hugging Face shapes): one copy, into memory the
    caller chose (a weight arena's, which a sync then sends where it lies)."""
    groups, per, dim = spec.num_kv_heads, spec.heads_per_group, spec.head_dim
    rest = tuple(qkv.shape[1:])
    grouped = qkv.reshape(groups, (per + 2) * dim, *rest)
    for target, part in zip(out, grouped.split([per * dim, dim, dim], dim=1), strict=True):
        target.view(groups, -1, *rest).copy_(part)
    return out


def pad_vocab(tensor: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    extra = spec.padded_vocab_size - tensor.shape[0]
    if extra < 0:
        raise ConvertError(
            f"the embedding has {tensor.shape[0]} rows, more than vocab_size="
            f"{spec.vocab_size} padded to {spec.padded_vocab_size}; fix config.json"
        )
    if extra == 0:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((extra,) + tuple(tensor.shape[1:]))], dim=0)
