"""A model directory's small files, named once (``rlx.formats.hf_dir``): every module that copies or looks for a
tokenizer uses the one list, and every bounded JSON read refuses an oversized, malformed or non-object file by
name with the caller's fix."""

import ast
from pathlib import Path

import pytest

from rlx.formats.hf_dir import TOKENIZER_FILES, TOKENIZER_MARKERS, copy_files, has_tokenizer, read_json_object

RLX = Path(__file__).parents[1] / "rlx"


def test_a_json_file_is_read_with_a_bound_as_one_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "qwen2"}')
    assert read_json_object(path, "a model config", "re-copy it") == {"model_type": "qwen2"}
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config.json holds a JSON list, not a model config; re-copy it"):
        read_json_object(path, "a model config", "re-copy it")
    path.write_text("{nope")
    with pytest.raises(KeyError, match=r"config.json is not valid JSON .*; re-copy it"):
        read_json_object(path, "a model config", "re-copy it", error=KeyError)
    path.write_bytes(b"{}" + b" " * 2048)
    with pytest.raises(ValueError, match=r"is 0 MiB, not a model config; re-copy it"):
        read_json_object(path, "a model config", "re-copy it", max_bytes=1024)
    with pytest.raises(FileNotFoundError):
        read_json_object(tmp_path / "absent.json", "a model config", "re-copy it")


def test_tokenizer_files_are_found_and_copied(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    assert not has_tokenizer(src)
    (src / "merges.txt").write_text("a b\n")
    assert not has_tokenizer(src)  # merges alone are no tokenizer
    (src / "vocab.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"weights")
    assert has_tokenizer(src) and set(TOKENIZER_MARKERS) <= set(TOKENIZER_FILES)
    assert copy_files(src, dst, TOKENIZER_FILES) == ["vocab.json", "merges.txt"]
    assert sorted(p.name for p in dst.iterdir()) == ["merges.txt", "vocab.json"]


def test_no_module_lists_the_tokenizer_files_again():
    """A tuple of file names holding tokenizer.json anywhere but hf_dir is a copy of the list."""
    copies = []
    for path in RLX.rglob("*.py"):
        if path.name == "hf_dir.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List)) and any(
                isinstance(e, ast.Constant) and e.value == "tokenizer.json" for e in node.elts
            ):
                copies.append(f"{path.relative_to(RLX.parent)}:{node.lineno}")
    assert not copies, f"use rlx.formats.hf_dir's TOKENIZER_FILES / TOKENIZER_MARKERS instead: {copies}"
