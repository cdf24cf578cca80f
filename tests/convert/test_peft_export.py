"""`rlx convert-ckpt` of a LoRA trainer checkpoint: a PEFT adapter directory that peft loads onto the
base model and that gives the logits of the trainer's merged model."""

import json

import pytest
import torch
from typer.testing import CliRunner

from rlx.cli import app
from rlx.config.roles import trainer_role
from rlx.trainer.checkpoint import save_checkpoint
from tests.trainer.test_lora import LORA, lora_trainer
from tests.trainer.test_trainer_step import ragged_batch

runner = CliRunner()


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A LoRA trainer after two steps (the adapter is non-zero) and its checkpoint."""
    trainer = lora_trainer(tiny_model_dir)
    for seed in (1, 2):
        trainer.step(ragged_batch(seed=seed))
    root = tmp_path_factory.mktemp("lora_run") / "checkpoints"
    ckpt = save_checkpoint(
        root,
        2,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        str(tiny_model_dir),
        {"step": 2, "data": {}},
        keep=2,
    )
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
    assert not torch.allclose(
        expected, AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits, atol=1e-4
    )  # the adapter changes the model: the comparison means something
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_adapter_checkpoint_refuses_hf_and_plans_peft(lora_run, tmp_path):
    _, ckpt = lora_run
    code, text = _convert(ckpt, tmp_path / "hf", "--to", "hf")
    assert code == 2 and "holds a LoRA adapter" in text and "--to peft" in text
    assert not (tmp_path / "hf").exists()
    code, text = _convert(ckpt, tmp_path / "plan", "--to", "peft", "--dry-run", "--dtype", "bfloat16")
    assert code == 0 and "PEFT adapter" in text and "lora_A" in text and not (tmp_path / "plan").exists()


def test_full_checkpoint_refuses_peft(tiny_model_dir, tmp_path):
    from rlx.config.model import ModelConfig
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.trainer import Trainer

    trainer = Trainer(
        trainer_role(RunConfig(model=ModelConfig(path=str(tiny_model_dir)), trainer=TrainerConfig(device="cpu")))
    )
    ckpt = save_checkpoint(
        tmp_path / "checkpoints",
        1,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        str(tiny_model_dir),
        {"step": 1, "data": {}},
        keep=1,
    )
    code, text = _convert(ckpt, tmp_path / "adapter", "--to", "peft")
    assert code == 2 and "holds full model weights, not a LoRA adapter" in text


def test_the_adapter_names_its_base_model_by_an_absolute_path(lora_run, tiny_model_dir, tmp_path, monkeypatch):
    """A run's model.path is relative to where it ran (.cache/models/...); the adapter must load from anywhere:
    AutoPeftModelForCausalLM reads base_model_name_or_path. Also for a checkpoint that recorded a relative path."""
    import shutil

    from peft import AutoPeftModelForCausalLM

    trainer, _ = lora_run
    shutil.copytree(tiny_model_dir, tmp_path / "work" / "models" / "base")
    monkeypatch.chdir(tmp_path / "work")
    ckpt = save_checkpoint(
        tmp_path / "run" / "checkpoints",
        2,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        "models/base",
        {"step": 2, "data": {}},
        keep=1,
    )
    base = str(tmp_path / "work" / "models" / "base")
    assert json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    _rewrite_as_older_rlx(ckpt, base_model="models/base")
    code, text = _convert(ckpt, tmp_path / "out" / "adapter")
    assert code == 0, text
    monkeypatch.chdir(tmp_path)  # somewhere else
    config = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == base
    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "out" / "adapter")
    assert model.peft_config["default"].r == LORA.rank


def _rewrite_as_older_rlx(ckpt, base_model: str) -> None:
    """adapter_config.json as an older rlx wrote it (the path as given), the manifest's hash of it updated."""
    import hashlib

    path = ckpt / "adapter_config.json"
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base_model
    data = (json.dumps(config, indent=2) + "\n").encode()
    path.write_bytes(data)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["adapter_config.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest, indent=2))
