"""Broken conversion input through the real `rlx convert-ckpt`: one `error:` line naming the file and
the fix, exit 2, the source untouched and no destination written (an existing one kept as it was)."""

import json
import shutil
import struct
import sys

import pytest
from convert_helpers import build_family_model, tree_digest, write_trainer_checkpoint
from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def convert(*args) -> tuple[int, str]:
    result = runner.invoke(app, ["convert-ckpt", *map(str, args)])
    return result.exit_code, result.output


def assert_refused(code: int, output: str, *fragments: str) -> None:
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for fragment in fragments:
        assert fragment in output, output


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_family_model(tmp_path_factory.mktemp("errors") / "qwen2", "qwen2", hidden_size=64)


def write_safetensors(path, header: object, data_bytes: int) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)


@pytest.mark.parametrize(
    "header, data_bytes, expected",
    [
        ([1, 2], 0, "a JSON list, not an object of tensors"),
        ({"a": {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}}, 16, "must be non-negative integers"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}}, 16, "must be non-negative integers"),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [100, 116]}}, 16, "is truncated"),
        (
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
            },
            16,
            "overlaps the tensor before it",
        ),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, 16, "leaves a gap at byte 0"),
        ({"__metadata__": [1], "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8, "__metadata__"),
        ({"a": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, 8, "which rlx does not convert"),
        ({"a": [1]}, 8, "header entry for 'a' is malformed"),
    ],
)
def test_malformed_safetensors_headers_are_refused(model, tmp_path, header, data_bytes, expected):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2(model / "config.json", src / "config.json")
    write_safetensors(src / "model.safetensors", header, data_bytes)
    code, output = convert(src, tmp_path / "out", "--to", "hf")
    assert_refused(code, output, "model.safetensors", expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "config_text, expected",
    [
        ("{not json", "config.json is not valid JSON"),
        ("[1, 2]", "config.json holds a JSON list"),
        (None, "holds safetensors weights but no config.json"),
    ],
)
@pytest.mark.parametrize("target", ["hf", "torch_dist"])
def test_broken_or_missing_config_is_named_and_an_existing_output_is_kept(
    model, tmp_path, config_text, expected, target
):
    src = tmp_path / "src"
    shutil.copytree(model, src)
    if config_text is None:
        (src / "config.json").unlink()
    else:
        (src / "config.json").write_text(config_text)
    before = tree_digest(src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    code, output = convert(src, out, "--to", target, "--overwrite", "--dtype", "bfloat16")
    assert_refused(code, output, expected)
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and tree_digest(src) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging directory left


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda m: [m], "holds a JSON list, not a manifest"),
        (lambda m: dict(m, files={}), "lists no files"),
        (lambda m: dict(m, model_files=[]), "lists no model_files"),
        (lambda m: dict(m, model_files=["elsewhere.safetensors"]), "does not list it among its files"),
        (lambda m: dict(m, files={"../../etc/passwd": {"bytes": 1, "sha256": "0"}}), "a path outside the checkpoint"),
        (lambda m: dict(m, files={k: [v] for k, v in m["files"].items()}), "the checkpoint is corrupt"),
        (lambda m: dict(m, step="ten"), "not a step number"),
    ],
)
def test_malformed_trainer_manifest_is_refused(model, tmp_path, edit, expected):
    from transformers import AutoModelForCausalLM

    ckpt = write_trainer_checkpoint(tmp_path / "run", AutoModelForCausalLM.from_pretrained(model), model, step=3)
    manifest = ckpt / "manifest.json"
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    code, output = convert(ckpt, tmp_path / "out")
    assert_refused(code, output, "refusing to convert a corrupt or partial checkpoint", expected)
    assert not (tmp_path / "out").exists()


def test_odd_sources_are_one_line(model, tmp_path):
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(model)
    for step in (1, 2):
        ckpt = write_trainer_checkpoint(tmp_path / "run", loaded, model, step=step)
        (ckpt / "model-00000.safetensors").write_bytes(b"torn")
    code, output = convert(tmp_path / "run", tmp_path / "out")
    assert_refused(code, output, "no complete checkpoint", "step_00000001", "step_00000002")
    indexed = tmp_path / "indexed"
    shutil.copytree(model, indexed)
    (indexed / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": ["a.safetensors"]}}))
    code, output = convert(indexed, tmp_path / "out", "--to", "hf")
    assert_refused(code, output, "model.safetensors.index.json maps a tensor to", "not the file name of a shard")
    code, output = convert(model / "config.json", tmp_path / "out", "--to", "hf")
    assert_refused(code, output, "is a file; pass the directory")
    assert not (tmp_path / "out").exists()


def test_a_config_json_that_does_not_describe_the_weights_is_named(model, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(model, src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(config, hidden_size=config["hidden_size"] // 2)))
    code, output = convert(src, tmp_path / "out", "--to", "torch_dist")
    assert code == 2 and "Traceback" not in output, output  # found while mapping: after the progress line
    assert output.strip().splitlines()[-1].startswith("error: q/k/v_proj have"), output
    assert "does not describe them" in output and not (tmp_path / "out").exists()


def test_huge_sparse_manifest_and_config_are_refused_without_reading_them(model, tmp_path):
    from transformers import AutoModelForCausalLM

    def sparse(path):
        with open(path, "wb") as f:
            f.truncate(64 << 30)  # no disk used; read whole it would be a MemoryError

    ckpt = write_trainer_checkpoint(tmp_path / "run", AutoModelForCausalLM.from_pretrained(model), model, step=3)
    sparse(ckpt / "manifest.json")
    code, output = convert(ckpt, tmp_path / "out")
    assert_refused(code, output, "65536 MiB, not a manifest")
    src = tmp_path / "src"
    shutil.copytree(model, src)
    sparse(src / "config.json")
    code, output = convert(src, tmp_path / "out", "--to", "torch_dist")
    assert_refused(code, output, "65536 MiB, not a model config")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flag, expected",
    [(["--workers", "-1"], "--workers -1 must be >= 1"), (["--iteration", "-1"], "--iteration -1 must be >= 0")],
)
def test_out_of_range_counts_are_refused(model, tmp_path, flag, expected):
    code, output = convert(model, tmp_path / "out", "--to", "torch_dist", *flag)
    assert_refused(code, output, expected)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def without_megatron(monkeypatch):
    """megatron-core as if not installed: its import fails (None in sys.modules stops an import)."""
    for name in ("megatron", "megatron.core"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("dry_run", [True, False])
def test_torch_dist_without_megatron_core_is_one_line_naming_the_install(model, tmp_path, without_megatron, dry_run):
    out = tmp_path / "megatron"
    code, output = convert(model, out, "--to", "torch_dist", *(["--dry-run"] if dry_run else []))
    assert_refused(code, output, "--to torch_dist needs megatron-core", 'pip install -e ".[megatron]"')
    assert not out.exists()
    source = tmp_path / "torch_dist"
    source.mkdir()
    (source / "latest_checkpointed_iteration.txt").write_text("0\n")
    code, output = convert(source, tmp_path / "hf", *(["--dry-run"] if dry_run else []))
    assert_refused(
        code, output, f"converting {source} from torch_dist needs megatron-core", 'pip install -e ".[megatron]"'
    )
    assert not (tmp_path / "hf").exists()
