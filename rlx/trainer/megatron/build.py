"""This rank's megatron-core GPTModel, built from the Hugging Face config.json of ``model.path``.

The shape comes from ``rlx.convert.megatron.spec`` (the converter's reading of the config: heads and query
groups, FFN size, tied head, QKV bias, Q/K norms; other families and MoE are refused there), the vocabulary padded
to a multiple of the tensor-parallel size only (the padded rows are masked out of every softmax,
``rlx.trainer.megatron.logprobs``). The layer spec is Transformer Engine's where ``transformer_engine`` imports,
else megatron's local one (``layer_spec_name``). Built without dropout, in ``model.dtype``, on this rank's
device; the weights are left uninitialised: ``rlx.trainer.megatron.weights`` loads them.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import torch

from rlx.convert.megatron.runtime import architecture
from rlx.convert.megatron.spec import ModelSpec, read_spec
from rlx.trainer.megatron.parallel import Layout


def layer_spec_name() -> str:
    """'te' where Transformer Engine can be imported, else 'local' (megatron-core's own modules)."""
    try:
        return "te" if importlib.util.find_spec("transformer_engine") is not None else "local"
    except (ImportError, ValueError):
        return "local"


def model_spec(model_path: str, tensor_parallel: int) -> ModelSpec:
    return read_spec(Path(model_path) / "config.json", tensor_parallel)


def build_gpt_model(spec: ModelSpec, layout: Layout, dtype: torch.dtype, device: torch.device):
    """GPTModel for this rank's pipeline stage and tensor-parallel shard."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt import gpt_layer_specs as specs
        from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        **architecture(spec),
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        pipeline_dtype=dtype,
        use_cpu_initialization=device.type == "cpu",
        perform_initialization=False,
        params_dtype=dtype,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )
    if layer_spec_name() == "te":
        layer_spec = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm)
    else:
        layer_spec = specs.get_gpt_layer_local_spec(qk_layernorm=spec.qk_norm, normalization="RMSNorm")
        from rlx.trainer.megatron.attention import sdpa_attention_class

        layer_spec.submodules.self_attention.submodules.core_attention = sdpa_attention_class()
    with torch.device(device):
        model = GPTModel(
            config,
            layer_spec,
            vocab_size=spec.padded_vocab_size,
            max_sequence_length=spec.max_position_embeddings,
            pre_process=layout.first_stage,
            post_process=layout.last_stage,
            position_embedding_type="rope",
            rotary_base=int(spec.rope_theta),
            share_embeddings_and_output_weights=spec.tie_word_embeddings,
        )
    return model
