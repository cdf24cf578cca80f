"""Checkpoint plugins through real entry-point discovery and real `rlx train` runs (hf backend).

The example package ``rlx_example_plugin`` is installed for the test as a ``*.dist-info`` with the
entry points of its ``pyproject.toml`` on the runs' ``PYTHONPATH``, so rlx finds it the way it finds
any installed plugin."""

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from rlx.formats.checkpoint import list_checkpoints, verify_checkpoint
from rlx.trainer.checkpoint import load_checkpoint, newest_complete_checkpoint
from tests.launch.test_train import read_metrics, run_to_end, small_config

pytestmark = pytest.mark.slow

PACKAGE = Path(__file__).parent / "rlx_example_plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A directory that holds the example package as installed: its module and a dist-info."""
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(PACKAGE / "rlx_example_plugin", site / "rlx_example_plugin")
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    info = site / f"rlx_example_plugin-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = [
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
        for group, eps in project["entry-points"].items()
    ]
    (info / "entry_points.txt").write_text("\n".join(lines))
    return site


def run(config: Path, tmp_path: Path, site: Path, *args: str):
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site)] + ([before] if before else []))  # start_rlx passes it on
    os.environ["RLX_EXAMPLE_PLUGIN_LOG"] = str(tmp_path / "hooks.jsonl")
    try:
        return run_to_end(config, tmp_path, *args, timeout_s=300)
    finally:
        del os.environ["RLX_EXAMPLE_PLUGIN_LOG"]
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def hooks(tmp_path: Path) -> list[tuple]:
    lines = (tmp_path / "hooks.jsonl").read_text().splitlines()
    return [(e["hook"], e["step"]) for e in map(json.loads, lines)]


def test_hooks_fire_in_order_through_a_run_and_its_resume(site, tiny_model_dir, tmp_path):
    config = small_config(
        tmp_path, tiny_model_dir, "hf", checkpoint={"every": 1, "keep": 3, "plugins": ["example_recorder"]}
    )
    code, output = run(config, tmp_path, site, "trainer.total_steps=2", "trainer.eval_every=0")
    assert code == 0, output[-3000:]
    assert hooks(tmp_path) == [("on_save", 1), ("after_step", 1), ("on_save", 2), ("after_step", 2)]
    for ckpt in list_checkpoints(tmp_path / "run" / "checkpoints"):
        assert "example_plugin.json" in verify_checkpoint(ckpt)["files"]  # written before the manifest
    code, output = run(config, tmp_path, site, "trainer.total_steps=3", "trainer.eval_every=0", "--resume")
    assert code == 0, output[-3000:]
    assert hooks(tmp_path)[4:] == [("on_load", 2), ("on_save", 3), ("after_step", 3)]
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [1, 2, 3]


def test_unknown_plugin_fails_before_any_process_starts(site, tiny_model_dir, tmp_path):
    config = small_config(tmp_path, tiny_model_dir, "hf", checkpoint={"plugins": ["example_recorder", "nope"]})
    code, output = run(config, tmp_path, site)
    text = " ".join(output.split())
    assert code == 2, output[-3000:]
    assert "checkpoint.plugins names 'nope', which is not an installed rlx plugin" in text
    assert "installed: example_failing, example_recorder" in text
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_raising_plugin_fails_the_run_and_keeps_the_newest_checkpoint(site, tiny_model_dir, tmp_path):
    from rlx.config.model import LoraConfig
    from tests.trainer.test_lora import lora_trainer

    config = small_config(
        tmp_path,
        tiny_model_dir,
        "hf",
        checkpoint={"every": 1, "keep": 3, "plugins": ["example_recorder", "example_failing"]},
        model={"lora": {"rank": 4}},
    )
    code, output = run(config, tmp_path, site, "trainer.total_steps=3", "trainer.eval_every=0")
    assert code == 1, output[-3000:]
    assert (
        "checkpoint plugin 'example_failing' failed in on_save: OSError: example upload of step 2 failed"
        in " ".join(output.split())
    )
    root = tmp_path / "run" / "checkpoints"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000001"] and not list(root.glob(".tmp-*"))
    ckpt, skipped = newest_complete_checkpoint(root)
    assert ckpt == root / "step_00000001" and skipped == []
    trainer = lora_trainer(tiny_model_dir, lora=LoraConfig(rank=4))
    state = load_checkpoint(ckpt, trainer.model, trainer.optimizer, trainer.scheduler)
    assert state["step"] == 1
    assert hooks(tmp_path) == [("on_save", 1), ("after_step", 1), ("on_save", 2)]


BROKEN = {
    "missing_module": "rlx_no_such_plugin_module:Plugin",
    "raising_factory": "rlx_broken_plugin:Raising",
    "missing_name": "rlx_broken_plugin:NoSuchClass",
}


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> Path:
    """Installed plugins that cannot be made: a module that is not there, a factory that raises, a name the
    module lacks."""
    site = tmp_path_factory.mktemp("broken_site")
    (site / "rlx_broken_plugin.py").write_text(
        "class Raising:\n    def __init__(self):\n        raise RuntimeError('RLX_BROKEN_TOKEN is not set')\n"
    )
    info = site / "rlx_broken_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlx-broken-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[rlx.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in BROKEN.items()))
    return site


@pytest.mark.parametrize(
    "name, expected",
    [
        (
            "missing_module",
            [
                "checkpoint plugin 'missing_module' (rlx_no_such_plugin_module:Plugin) cannot be imported",
                "No module named 'rlx_no_such_plugin_module'",
                "reinstall the package that provides it",
            ],
        ),
        (
            "missing_name",
            ["checkpoint plugin 'missing_name' (rlx_broken_plugin:NoSuchClass) cannot be imported", "AttributeError"],
        ),
        (
            "raising_factory",
            [
                "checkpoint plugin 'raising_factory': making it (rlx_broken_plugin:Raising, called with no "
                "arguments) raised RuntimeError: RLX_BROKEN_TOKEN is not set",
                "fix the plugin or its environment",
            ],
        ),
    ],
)
def test_a_plugin_that_cannot_be_made_fails_before_any_process_starts(
    broken_site, tiny_model_dir, tmp_path, name, expected
):
    config = small_config(tmp_path, tiny_model_dir, "hf", checkpoint={"plugins": [name]})
    code, output = run(config, tmp_path, broken_site)
    text = " ".join(output.split())
    assert code == 2, output[-3000:]
    for fragment in expected + [f"or remove {name!r} from checkpoint.plugins"]:
        assert fragment in text, output[-3000:]
    assert "Traceback" not in output
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
