"""`rlx convert-ckpt` / `rlx fp8-convert` from the command line: destinations, dry runs, bad input."""

import json

import pytest
from convert_helpers import build_family_model, read_hf_weights, tree_digest
from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def _run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    try:
        text = result.output + result.stderr
    except ValueError:  # stderr mixed into output
        text = result.output
    return result.exit_code, " ".join(text.split())


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_family_model(tmp_path_factory.mktemp("cli") / "llama", "llama", hidden_size=256)


def test_missing_parents_are_created_and_existing_destination_is_refused(model, tmp_path):
    before = tree_digest(model)
    code, text = _run("convert-ckpt", model, tmp_path / "no" / "such" / "out", "--to", "hf", "--dry-run")
    assert code == 0 and not (tmp_path / "no").exists(), text  # a dry run creates nothing
    code, text = _run("convert-ckpt", model, tmp_path / "no" / "such" / "out", "--to", "hf")
    assert code == 0 and (tmp_path / "no" / "such" / "out" / "config.json").is_file(), text
    code, text = _run("fp8-convert", model, tmp_path / "fp8" / "out")
    assert code == 0 and (tmp_path / "fp8" / "out" / "model.safetensors").is_file(), text
    (tmp_path / "afile").write_text("x")
    code, text = _run("convert-ckpt", model, tmp_path / "afile" / "out", "--to", "hf")
    assert code == 2 and "which is a file" in text
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("user data")
    code, text = _run("fp8-convert", model, tmp_path / "taken")
    assert code == 2 and "already exists; pass --overwrite" in text
    assert (tmp_path / "taken" / "keep.txt").read_text() == "user data"
    code, text = _run("fp8-convert", model, tmp_path / "taken", "--overwrite")
    assert code == 0, text
    assert not (tmp_path / "taken" / "keep.txt").exists() and (tmp_path / "taken" / "model.safetensors").is_file()
    assert tree_digest(model) == before


def test_destination_inside_the_source_is_refused(model):
    code, text = _run("convert-ckpt", model, model / "out", "--to", "hf")
    assert code == 2 and "overlaps the source" in text
    code, text = _run("fp8-convert", model, model, "--overwrite")
    assert code == 2 and "overlaps the source" in text


def test_dry_run_prints_the_plan_and_writes_nothing(model, tmp_path):
    code, text = _run("convert-ckpt", model, tmp_path / "out", "--to", "torch_dist", "--dry-run")
    assert code == 0, text
    assert "linear_qkv" in text and "peak memory" in text and not (tmp_path / "out").exists()
    code, text = _run("fp8-convert", model, tmp_path / "out", "--dry-run", "--skip", "*.down_proj")
    assert code == 0, text
    assert "weight_scale_inv" in text and "--skip *.down_proj" in text and not (tmp_path / "out").exists()


def test_fp8_report_json_and_table(model, tmp_path):
    code, text = _run("fp8-convert", model, tmp_path / "out", "--report", tmp_path / "report.json")
    assert code == 0, text
    assert "max rel err" in text and "kept in high precision" in text
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["bytes_in"] > report["bytes_out"] > 0
    assert len(report["quantized"]) == 14 and all(t["max_rel_error"] <= 2.0**-4 for t in report["quantized"])
    assert {k["reason"] for k in report["kept"]} >= {"embedding", "lm_head", "not a 2-D weight"}


def test_failure_midway_leaves_no_destination(model, tmp_path, monkeypatch):
    import rlx.convert.safetensors_writer as writer

    calls = []

    def failing_write(f, tensor, chunk):
        calls.append(tensor.name)
        if len(calls) > 3:
            raise OSError(28, "No space left on device")
        return original(f, tensor, chunk)

    original = writer._write_chunk
    monkeypatch.setattr(writer, "_write_chunk", failing_write)
    result = runner.invoke(app, ["convert-ckpt", str(model), str(tmp_path / "out"), "--to", "hf"])
    assert result.exit_code != 0 and isinstance(result.exception, OSError)
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_name_the_fix(model, tmp_path):
    code, text = _run("convert-ckpt", tmp_path / "absent", tmp_path / "out")
    assert code == 2 and "does not exist" in text
    code, text = _run("convert-ckpt", model, tmp_path / "out")
    assert code == 2 and "already a Hugging Face directory: pass --to torch_dist" in text
    code, text = _run("convert-ckpt", model, tmp_path / "out", "--to", "onnx")
    assert code == 2 and "--to onnx is not a target" in text
    code, text = _run("convert-ckpt", model, tmp_path / "out", "--to", "hf", "--shard-size", "5 parsecs")
    assert code == 2 and "not understood" in text
    code, text = _run("fp8-convert", model, tmp_path / "out", "--strategy", "row")
    assert code == 2 and "--strategy row is unknown" in text


def test_hf_reshard_keeps_every_tensor(model, tmp_path):
    code, text = _run("convert-ckpt", model, tmp_path / "out", "--to", "hf", "--shard-size", "1MB")
    assert code == 0, text
    out, src = read_hf_weights(tmp_path / "out"), read_hf_weights(model)
    assert out.keys() == src.keys() and all((out[k] == src[k]).all() for k in src)


def test_broken_sources_exit_2_and_stay_untouched(model, tmp_path):
    import shutil

    from convert_helpers import write_trainer_checkpoint
    from transformers import AutoModelForCausalLM

    src = tmp_path / "src"
    shutil.copytree(model, src)
    shard = src / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    before = tree_digest(src)
    for command in (["fp8-convert", src, tmp_path / "a"], ["convert-ckpt", src, tmp_path / "b", "--to", "torch_dist"]):
        code, text = _run(*command)
        assert code == 2 and "model.safetensors is truncated" in text and "re-copy" in text
    ckpt = write_trainer_checkpoint(tmp_path / "run", AutoModelForCausalLM.from_pretrained(model), model, step=4)
    (ckpt / "model-00001.safetensors").unlink()
    code, text = _run("convert-ckpt", ckpt, tmp_path / "c")
    assert code == 2 and "model-00001.safetensors is listed in the manifest but missing" in text
    assert tree_digest(src) == before and not any((tmp_path / n).exists() for n in "abc")
