"""`rlx convert-ckpt` of a LoRA trainer checkpoint: a PEFT adapter directory that peft loads onto the
base model and that gives the logits of the trainer's merged model."""

import json

import pytest
import torch
from typer.testing import CliRunner

from rlx.cli import app
from rlx.engine.checkpoint import save_checkpoint
from tests.engine.test_lora import LORA, lora_trainer
from tests.engine.test_trainer_step import ragged_batch

runner = CliRunner()


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A LoRA trainer after two steps (the adapter is non-zero) and its checkpoint."""
    trainer = lora_trainer(tiny_model_dir)
    for seed in (1, 2):
        trainer.step(ragged_batch(seed=seed))
    root = tmp_path_factory.mktemp("lora_run") / "checkpoints"
    ckpt = save_checkpoint(root, 2, trainer.model, trainer.optimizer, trainer.scheduler, str(tiny_model_dir),
                           {"step": 2, "data": {}}, keep=2)
    return trainer, ckpt


def _convert(*args):
    result = runner.invoke(app, ["convert-ckpt", *map(str, args)])
    return result.exit_code, " ".join(result.output.split())


def test_exported_adapter_loads_in_peft_with_the_trainers_logits(lora_run, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer, ckpt = lora_run
    code, text = _convert(ckpt.parent.parent, tmp_path / "adapter")  # a run directory; peft is the default
    assert code == 0, text
    out = tmp_path / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == LORA.rank
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out).eval()
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    merged.load_state_dict(dict(trainer.named_tensors()), strict=False)  # lm_head is tied to the embedding
    ids = torch.randint(4, 40, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = merged(input_ids=ids).logits, peft_model(input_ids=ids).logits
    assert not torch.allclose(expected, AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits,
                              atol=1e-4)  # the adapter changes the model: the comparison means something
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_adapter_checkpoint_refuses_hf_and_plans_peft(lora_run, tmp_path):
    _, ckpt = lora_run
    code, text = _convert(ckpt, tmp_path / "hf", "--to", "hf")
    assert code == 2 and "holds a LoRA adapter" in text and "--to peft" in text
    assert not (tmp_path / "hf").exists()
    code, text = _convert(ckpt, tmp_path / "plan", "--to", "peft", "--dry-run", "--dtype", "bfloat16")
    assert code == 0 and "PEFT adapter" in text and "lora_A" in text and not (tmp_path / "plan").exists()


def test_full_checkpoint_refuses_peft(tiny_model_dir, tmp_path):
    from rlx.config.schema import ModelConfig, RunConfig, TrainerConfig
    from rlx.engine.trainer import Trainer

    trainer = Trainer(RunConfig(model=ModelConfig(path=str(tiny_model_dir)), trainer=TrainerConfig(device="cpu")))
    ckpt = save_checkpoint(tmp_path / "checkpoints", 1, trainer.model, trainer.optimizer, trainer.scheduler,
                           str(tiny_model_dir), {"step": 1, "data": {}}, keep=1)
    code, text = _convert(ckpt, tmp_path / "adapter", "--to", "peft")
    assert code == 2 and "holds full model weights, not a LoRA adapter" in text
