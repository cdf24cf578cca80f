"""Trainer checkpoint -> Hugging Face: real files, real transformers loading, logits compared."""

import json

import pytest
import torch
from convert_helpers import read_hf_weights, tree_digest, write_trainer_checkpoint
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlx.convert.convert_ckpt import ConvertOptions, build_job
from rlx.convert.errors import ConvertError

PROMPT = "12+34=46\nWhat is 7*8?"


def _logits(model, model_dir):
    ids = AutoTokenizer.from_pretrained(model_dir)(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A kit model with untied embeddings, nudged as a trainer would, saved at steps 10 and 20."""
    from rlx.trainer.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("trainer")
    hf_dir = build_tiny_model(root / "base", tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    run = root / "run"
    write_trainer_checkpoint(run, model, hf_dir, step=10)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    write_trainer_checkpoint(run, model, hf_dir, step=20)
    return run, model, hf_dir


def _convert(src, dst, **options):
    job = build_job(src, ConvertOptions(**options))
    return job.run(dst, Console(quiet=True), show_progress=False)


def test_checkpoint_to_hf_gives_the_trainer_logits(trained, tmp_path):
    run, model, _ = trained
    step_dir = run / "checkpoints" / "step_00000020"
    before = tree_digest(step_dir)
    _convert(step_dir, tmp_path / "hf", shard_bytes=150_000)
    out = tmp_path / "hf"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    weights = read_hf_weights(out)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in weights.values())
    assert len(set(index["weight_map"].values())) > 1
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(_logits(loaded, out), _logits(model, out))
    assert tree_digest(step_dir) == before


def test_run_dir_takes_the_newest_complete_checkpoint_and_reports_skipped(trained, tmp_path):
    run, model, hf_dir = trained
    broken = write_trainer_checkpoint(tmp_path / "run", model, hf_dir, step=30)
    good = write_trainer_checkpoint(tmp_path / "run", AutoModelForCausalLM.from_pretrained(hf_dir), hf_dir, step=25)
    shard = broken / "model-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    job = build_job(tmp_path / "run", ConvertOptions())
    assert job.source == str(good)
    assert any("step_00000030" in note and "truncated" in note for note in job.notes)


def test_corrupt_step_dir_is_refused_with_the_verifier_message(trained, tmp_path):
    run, model, hf_dir = trained
    ckpt = write_trainer_checkpoint(tmp_path / "run", model, hf_dir, step=5)
    data = bytearray((ckpt / "model-00000.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (ckpt / "model-00000.safetensors").write_bytes(bytes(data))
    with pytest.raises(ConvertError, match="refusing to convert a corrupt .* sha256"):
        build_job(ckpt, ConvertOptions())
    (ckpt / "manifest.json").unlink()
    with pytest.raises(ConvertError, match="no manifest.json: it is partial"):
        build_job(ckpt, ConvertOptions())


def test_dtype_cast_writes_bf16_and_says_so_in_config(trained, tmp_path):
    run, model, _ = trained
    _convert(run, tmp_path / "bf16", dtype="bfloat16")
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    weights = read_hf_weights(tmp_path / "bf16")
    expected = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    assert all(torch.equal(weights[k], expected[k]) for k in weights)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32)
    torch.testing.assert_close(
        _logits(loaded, tmp_path / "bf16"), _logits(model, tmp_path / "bf16"), atol=0.05, rtol=0.05
    )
