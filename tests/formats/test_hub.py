"""Hub ids resolved from a cache in huggingface_hub's own layout, written here by hand (blobs named by their
sha256, refs holding commits, snapshots of symlinks into the blobs), read offline by ``snapshot_download``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from rlx.config.errors import ConfigError
from rlx.formats.hub import parse_id, resolve, snapshot_of


def write_hub_cache(hub_cache: Path, repo_id: str, model_dir: Path, refs: tuple[str, ...] = ("main",)) -> str:
    """``model_dir``'s files as one commit of ``repo_id`` in the cache ``hub_cache`` (HF_HOME/hub), named by
    ``refs``; returns the commit."""
    storage = hub_cache / f"models--{repo_id.replace('/', '--')}"
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    listing = "".join(f"{p.relative_to(model_dir)}:{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in files)
    commit = hashlib.sha1((repo_id + listing).encode()).hexdigest()
    for path in files:
        data = path.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = storage / "snapshots" / commit / path.relative_to(model_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (storage / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return commit


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty hub cache under tmp_path, read by this process's huggingface_hub, offline."""
    from huggingface_hub import constants

    hub_cache = tmp_path / "hf" / "hub"
    hub_cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return hub_cache


@pytest.mark.parametrize(
    "value, expected",
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", "")),
        ("org/tiny@v1.0", ("org/tiny", "v1.0")),
        ("./org/tiny", None),
        ("/models/tiny", None),
        ("~/tiny", None),
        ("models/tiny/hf", None),  # two slashes: a path
        ("tiny", None),  # no organisation: a path (the Hub's ids have one)
        ("org--x/tiny", None),  # "--" is not allowed in an id
        ("", None),
    ],
)
def test_what_counts_as_a_hub_id(value, expected):
    assert parse_id(value) == expected


def test_an_existing_directory_stays_local_even_where_it_reads_as_an_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    assert parse_id("org/tiny") is None
    assert resolve("org/tiny", "model.path") is None


def test_an_id_resolves_offline_to_its_snapshot_at_a_branch_a_tag_and_a_commit(tiny_model_dir, offline_cache):
    from transformers import AutoConfig

    from rlx.trainer.model import check_model_dir

    commit = write_hub_cache(offline_cache, "org/tiny", tiny_model_dir, refs=("main", "v1"))
    for value, revision in (("org/tiny", ""), ("org/tiny", "v1"), ("org/tiny@v1", ""), ("org/tiny", commit)):
        snap = resolve(value, "model.path", revision, "model.revision")
        assert (snap.repo_id, snap.commit) == ("org/tiny", commit)
        assert Path(snap.path) == (offline_cache / "models--org--tiny" / "snapshots" / commit).resolve()
    check_model_dir(snap.path)  # the snapshot is a whole model directory: weights, config, tokenizer
    assert AutoConfig.from_pretrained(snap.path).model_type == AutoConfig.from_pretrained(tiny_model_dir).model_type
    assert snapshot_of(snap.path) == snap


def test_an_id_missing_from_the_cache_says_what_is_missing_and_how_to_fetch_it(offline_cache):
    with pytest.raises(ConfigError) as error:
        resolve("org/absent", "model.path", "", "model.revision")
    message = str(error.value)
    assert "model.path='org/absent' is not a local directory" in message
    assert f"the cache ({offline_cache}) holds nothing of org/absent" in message
    assert "HF_HUB_OFFLINE=1 reads only the cache" in message
    assert f"HF_HOME={offline_cache.parent} hf download org/absent --revision main" in message


def test_a_revision_the_cache_lacks_names_the_revisions_it_holds(tiny_model_dir, offline_cache):
    commit = write_hub_cache(offline_cache, "org/tiny", tiny_model_dir, refs=("main",))
    for value, revision, key in (("org/tiny", "v2", "model.revision"), ("org/tiny@v2", "", "teacher's @REVISION")):
        with pytest.raises(ConfigError) as error:
            resolve(value, "algorithm.distill.teacher", revision, "model.revision" if revision else "")
        message = str(error.value)
        assert "not in the cache at revision 'v2'" in message
        assert f"its refs: main -> {commit[:12]}" in message and f"its snapshots: {commit[:12]}" in message
        assert "hf download org/tiny --revision v2" in message
        assert key in message
    with pytest.raises(ConfigError, match="pins revision 'v1' and model.revision='v2' pins another"):
        resolve("org/tiny@v1", "model.path", "v2", "model.revision")


def test_a_snapshot_path_reads_back_and_other_paths_do_not():
    commit = "a" * 40
    path = f"/cache/hub/models--Qwen--Qwen2.5-0.5B/snapshots/{commit}"
    assert snapshot_of(path).repo_id == "Qwen/Qwen2.5-0.5B"
    assert snapshot_of(path).commit == commit
    assert snapshot_of(f"{path}/config.json") is None  # a file in it is not the directory
    assert snapshot_of("/models/tiny") is None


def test_convert_ckpt_reads_a_hub_id_as_source_and_as_hf_config(tiny_model_dir, offline_cache, tmp_path):
    """Hub id -> torch_dist, and back with --hf-config a Hub id: the weights come back bit-exact."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from rlx.cli import app

    commit = write_hub_cache(offline_cache, "org/tiny", tiny_model_dir, refs=("main", "v1"))
    runner = CliRunner()
    out = runner.invoke(app, ["convert-ckpt", "org/tiny@v1", str(tmp_path / "meg"), "--to", "torch_dist"])
    assert out.exit_code == 0, out.output
    assert "SRC org/tiny@v1: Hub snapshot" in out.output and f"(commit {commit})" in out.output
    back = runner.invoke(
        app, ["convert-ckpt", str(tmp_path / "meg"), str(tmp_path / "back"), "--hf-config", "org/tiny"]
    )
    assert back.exit_code == 0, back.output
    original, restored = (
        load_file(tiny_model_dir / "model.safetensors"),
        load_file(tmp_path / "back" / "model.safetensors"),
    )
    assert original.keys() == restored.keys()
    assert all(original[k].equal(restored[k]) for k in original)
    missing = runner.invoke(app, ["convert-ckpt", "org/absent", str(tmp_path / "x"), "--to", "torch_dist"])
    assert missing.exit_code == 2 and "SRC='org/absent' is not a local directory" in missing.output
    assert "hf download org/absent --revision main" in missing.output
    assert not (tmp_path / "x").exists()
