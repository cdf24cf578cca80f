"""LoRA through peft in the trainer: only the adapter trains, merged weights for sync equal peft's
``merge_and_unload``, and a checkpoint of the adapter and its optimizer state resumes exactly."""

import pytest
import torch

from rlx.config.model import LoraConfig, ModelConfig
from rlx.config.roles import trainer_role
from rlx.config.schema import RunConfig
from rlx.config.trainer import TrainerConfig
from rlx.formats.checkpoint import ADAPTER_FILE, verify_checkpoint
from rlx.trainer.checkpoint import load_checkpoint, save_checkpoint
from rlx.trainer.lora import adapter_state
from rlx.trainer.trainer import Trainer
from tests.trainer.test_trainer_step import ragged_batch

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "gate_proj"], sync="merged")
# sync=merged: named_tensors yields the merged model (adapter-only sync: tests/sync/test_lora_sync.py)


def lora_trainer(model_dir, lora=LORA, **trainer) -> Trainer:
    torch.manual_seed(0)
    cfg = RunConfig(
        model=ModelConfig(path=str(model_dir), lora=lora),
        trainer=TrainerConfig(micro_batch_size=3, device="cpu", lr=1e-2, **trainer),
    )
    cfg.rollout.n = 4
    return Trainer(trainer_role(cfg))


def test_step_changes_only_the_adapter(tiny_model_dir):
    trainer = lora_trainer(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for n, p in trainer.model.named_parameters() if n in trainable}
    for seed in (1, 2):  # B starts at 0, so A has a gradient from the second step on
        trainer.step(ragged_batch(seed=seed))
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trainable


def test_merged_tensors_equal_peft_merge_and_unload(tiny_model_dir):
    from peft import get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from rlx.trainer.lora import peft_lora_config

    trainer = lora_trainer(tiny_model_dir)
    trainer.step(ragged_batch())
    merged = dict(trainer.named_tensors())
    plain = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert list(merged) == list(plain)  # base names, base order: the engines load a plain model
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), peft_lora_config(LORA))
    result = set_peft_model_state_dict(peft_model, adapter_state(trainer.model))  # a PeftModel keeps PEFT's names
    assert not result.unexpected_keys
    reference = dict(peft_model.merge_and_unload().named_parameters())
    adapted = [n for n in merged if not torch.equal(merged[n], plain[n])]
    assert adapted and all(n.split(".")[-2] in LORA.target_modules for n in adapted)
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6)
    layer = trainer.model.model.layers[0].self_attn.q_proj
    assert not layer.merged and torch.equal(layer.base_layer.weight, plain["model.layers.0.self_attn.q_proj.weight"])


def test_checkpoint_round_trip_resumes_exactly(tiny_model_dir, tmp_path):
    trainer = lora_trainer(tiny_model_dir)
    trainer.step(ragged_batch(seed=1))
    ckpt = save_checkpoint(
        tmp_path,
        1,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        str(tiny_model_dir),
        {"step": 1, "data": {}},
        keep=2,
    )
    manifest = verify_checkpoint(ckpt)
    assert manifest["model_files"] == [ADAPTER_FILE] and manifest["lora"] is True
    assert "model.safetensors" not in manifest["files"]
    resumed = lora_trainer(tiny_model_dir)
    load_checkpoint(ckpt, resumed.model, resumed.optimizer, resumed.scheduler)
    for key, value in adapter_state(trainer.model).items():
        assert torch.equal(value, adapter_state(resumed.model)[key]), key
    batch = ragged_batch(seed=2)
    a, b = trainer.step(batch), resumed.step(batch.clone() if hasattr(batch, "clone") else ragged_batch(seed=2))
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-7)
    for (name, x), (_, y) in zip(trainer.named_tensors(), resumed.named_tensors(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-7, msg=name)


@pytest.mark.parametrize("dropout, fused", [(0.0, True), (0.1, False)])
def test_lora_dropout_turns_single_pass_logprobs_off(tiny_model_dir, dropout, fused):
    lora = LoraConfig(rank=4, alpha=8.0, dropout=dropout, target_modules=["q_proj"])
    assert lora_trainer(tiny_model_dir, lora=lora).fused_logprobs is fused


def test_target_that_matches_nothing_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="matches no layer"):
        lora_trainer(tiny_model_dir, lora=LoraConfig(rank=4, target_modules=["nope_proj"]))
