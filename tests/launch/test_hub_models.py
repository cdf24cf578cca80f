"""`rlx train` from a Hugging Face Hub id, offline (HF_HUB_OFFLINE=1, HF_HOME a cache written in
huggingface_hub's layout): the launcher resolves the id once, every process reads the snapshot it recorded, W&B's
offline run holds the config with the resolved revision and every step's metrics, a resume stays on the commit
the run trained from, and what the cache lacks is refused before any process starts."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from rlx.config.errors import ConfigError
from tests.formats.test_hub import write_hub_cache
from tests.launch.test_preflight import assert_refused_before_start, train
from tests.launch.test_train import read_metrics, run_to_end, small_config
from tests.trace.test_sinks import read_wandb_run


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """HF_HOME under tmp_path, offline, for the rlx processes a test starts and for this one (CliRunner)."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    (home / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home / "hub"


@pytest.mark.slow
def test_train_from_a_hub_id_offline_records_the_snapshot_and_logs_it_to_wandb(
    tiny_model_dir, tmp_path, hub, monkeypatch
):
    pytest.importorskip("wandb")
    commit = write_hub_cache(hub, "org/tiny", tiny_model_dir)
    snapshot = str((hub / "models--org--tiny" / "snapshots" / commit).resolve())
    config = small_config(
        tmp_path,
        tiny_model_dir,
        "hf",
        model={"path": "org/tiny"},
        trainer={"total_steps": 2, "eval_every": 0},
        logging={"wandb": True, "wandb_project": "hub-test"},
    )
    wandb_files = tmp_path / "wandb_files"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_files))
    monkeypatch.setenv("WANDB_SILENT", "true")
    code, output = run_to_end(config, tmp_path)
    assert code == 0, output[-4000:]
    run_dir = tmp_path / "run"
    assert f"model.path=org/tiny: Hub snapshot {snapshot} (commit {commit})" in output.replace("\n", " ")
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    assert (recorded["path"], recorded["revision"]) == (snapshot, commit)
    server = json.loads((run_dir / "roles" / "rollout0.json").read_text())["model"]
    assert (server["path"], server["revision"]) == (snapshot, commit)  # the server loaded the same snapshot
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]

    logs = list(wandb_files.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, f"expected one offline W&B run under {wandb_files}, found {logs}"
    logged, history = read_wandb_run(logs[0])
    assert logged["model"]["path"] == snapshot and logged["model"]["revision"] == commit
    assert logged["hub"] == {"model.path": {"repo_id": "org/tiny", "commit": commit}}
    assert logged["trainer"]["total_steps"] == 2
    assert [h["_step"] for h in history] == [1, 2]
    for row, logged_row in zip(rows, history, strict=True):
        shared = {k for k, v in row.items() if isinstance(v, float)} & set(logged_row)
        assert "loss" in shared or "reward_mean" in shared, sorted(logged_row)
        assert {k: logged_row[k] for k in shared} == pytest.approx({k: row[k] for k in shared})
    run_id = (run_dir / "wandb" / "rlx_run_id").read_text().strip()
    assert logs[0].name == f"run-{run_id}.wandb"

    # main moves to a new commit: a resume stays on the one the run trained from; a pin of the new one is refused
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)
    (moved / "README.md").write_text("a later commit\n")
    shutil.rmtree(hub / "models--org--tiny" / "refs")
    new_commit = write_hub_cache(hub, "org/tiny", moved)
    assert new_commit != commit
    code, output = train(config, "--resume")
    assert code == 0, output
    assert f"stays at commit {commit}, the revision the run trained from" in output.replace("\n", " ")
    code, output = train(config, "--resume", f"model.revision={new_commit}")
    assert code == 2, output
    assert f"trained from commit {commit}; set model.revision={commit} to continue it" in output.replace("\n", " ")


def test_an_id_or_revision_the_cache_lacks_is_refused_before_anything_starts(tiny_model_dir, tmp_path, hub):
    commit = write_hub_cache(hub, "org/tiny", tiny_model_dir)
    config = small_config(tmp_path, tiny_model_dir, "hf")
    run_dir = tmp_path / "run"
    code, output = train(config, "model.path=org/absent")
    assert_refused_before_start(
        code, output, run_dir, "holds nothing of org/absent", "hf download org/absent --revision main"
    )
    code, output = train(config, "model.path=org/tiny", "model.revision=v9")
    assert_refused_before_start(code, output, run_dir, "not in the cache at revision 'v9'", f"main -> {commit[:12]}")
    code, output = train(config, "algorithm.distill.teacher=org/teacher@v1")
    assert_refused_before_start(code, output, run_dir, "algorithm.distill.teacher='org/teacher'", "--revision v1")
    code, output = train(config, "model.revision=v1")
    assert_refused_before_start(code, output, run_dir, "model.revision='v1' pins a Hub id's revision")


def test_logging_wandb_without_the_package_names_the_install_line(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb imports
    config = small_config(tmp_path, tiny_model_dir, "hf")
    code, output = train(config, "logging.wandb=true")
    assert_refused_before_start(code, output, Path(tmp_path / "run"), "logging.wandb=true needs the wandb package")
    assert "pip install wandb" in output


def test_a_rollout_server_started_by_hand_serves_a_hub_id(tiny_model_dir, tmp_path, hub):
    """`rlx rollout-serve JUDGE.yaml` (a judge, a served teacher) cuts its role from a run config whose model.path
    is an id: it resolves the id as the launcher does, and its OpenAI endpoint answers to the id."""
    from rlx.cli.rollout_serve import _role, _served_name

    commit = write_hub_cache(hub, "org/judge", tiny_model_dir, refs=("main", "v1"))
    config = small_config(tmp_path, tiny_model_dir, "hf", model={"path": "org/judge", "revision": "v1"})
    role = _role(str(config), [])
    assert (role.model.path, role.model.revision) == (
        str((hub / "models--org--judge" / "snapshots" / commit).resolve()),
        commit,
    )
    assert _served_name(role.model.path) == "org/judge"


def test_doctor_resolves_hub_ids_from_the_cache_alone(tiny_model_dir, tmp_path, hub, monkeypatch):
    """`rlx doctor` reads the snapshot of a cached id (then checks it as a local directory) and downloads nothing,
    online or not: an id the cache lacks is its row's problem, with the fetch command."""
    from rlx.config import load_config
    from rlx.launch.doctor import hub_check
    from tests.launch.test_doctor import run_doctor

    commit = write_hub_cache(hub, "org/tiny", tiny_model_dir)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    config = small_config(tmp_path, tiny_model_dir, "hf", model={"path": "org/tiny"})
    result = run_doctor(config, env={"COLUMNS": "500"})  # the table's rows on one line each
    found = " ".join(result.stdout.replace("│", " ").split())
    assert result.returncode == 0, result.stdout + result.stderr
    snapshot = (hub / "models--org--tiny" / "snapshots" / commit).resolve()
    assert f"hub models this host model.path=org/tiny: Hub snapshot {snapshot} (commit {commit}) ok" in found, found
    assert re.search(rf"model this host {re.escape(str(snapshot))}: [\d.]+M parameters ok", found), found
    [row] = hub_check(load_config(config, ["model.path=org/absent"]))
    assert row.found == "refused" and "this check reads only the cache" in row.fix
    assert "hf download org/absent --revision main" in row.fix


def test_the_teacher_and_the_reward_model_resolve_with_their_own_revision(tiny_model_dir, tmp_path, hub):
    """algorithm.distill.teacher and task.reward_model.path take ORG/NAME@REVISION; the launcher writes their
    snapshot directories into the config it hands every process, and a resume keeps the teacher's commit."""
    from rlx.config import load_config
    from rlx.launch.hub_models import resolve_run_models

    teacher = write_hub_cache(hub, "org/teacher", tiny_model_dir, refs=("main", "v1"))
    scorer = write_hub_cache(hub, "org/scorer", tiny_model_dir)
    config = small_config(tmp_path, tiny_model_dir, "hf")
    overrides = ["algorithm.distill.teacher=org/teacher@v1", "task.reward_model.kind=classifier"]
    cfg = load_config(config, [*overrides, "task.reward_model.path=org/scorer"])
    notes: list[str] = []
    resolve_run_models(cfg, tmp_path / "run", notes.append)
    assert cfg.algorithm.distill.teacher == str((hub / "models--org--teacher" / "snapshots" / teacher).resolve())
    assert cfg.task.reward_model.path == str((hub / "models--org--scorer" / "snapshots" / scorer).resolve())
    assert cfg.model.path == str(tiny_model_dir) and cfg.model.revision == ""  # a local directory stays as it is
    assert len(notes) == 2
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(
        yaml.safe_dump({"algorithm": {"distill": {"teacher": cfg.algorithm.distill.teacher}}})
    )
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    (other / "README.md").write_text("v2\n")
    newer = write_hub_cache(hub, "org/teacher", other, refs=("v2",))
    resumed = load_config(config, ["algorithm.distill.teacher=org/teacher@v2", "trainer.resume=true"])
    with pytest.raises(ConfigError, match=f"set algorithm.distill.teacher=org/teacher@{teacher} to continue it"):
        resolve_run_models(resumed, tmp_path / "run", notes.append)
    assert newer != teacher


def test_a_snapshot_missing_on_this_node_names_the_fetch(tmp_path):
    """A role file names the snapshot the launcher resolved; a node whose cache lacks it says how to get it."""
    from rlx.trainer.model import check_model_dir

    missing = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("b" * 40)
    with pytest.raises(FileNotFoundError, match=f"hf download org/tiny --revision {'b' * 40}"):
        check_model_dir(str(missing))


def test_a_path_a_build_writes_stays_local_and_a_note_says_how_to_train_the_id(tiny_model_dir, tmp_path, hub):
    from rlx.config import load_config
    from rlx.launch.hub_models import resolve_run_models

    write_hub_cache(hub, "org/tiny", tiny_model_dir)
    config = small_config(tmp_path, tiny_model_dir, "hf")
    cfg = load_config(config, ["model.path=org/tiny", "model.build_if_missing=tiny_math_warmstart"])
    notes: list[str] = []
    resolve_run_models(cfg, tmp_path / "run", notes.append)
    assert cfg.model.path == "org/tiny" and cfg.model.revision == ""  # the build's target, not the cached id
    assert notes == [
        "model.path=org/tiny is taken as the local path model.build_if_missing=tiny_math_warmstart builds, not as a "
        "Hugging Face Hub id; to train the Hub model, set model.build_if_missing=''"
    ]
