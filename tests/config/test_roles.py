"""Each process role reads its own view of the run: the launcher cuts it from ``RunConfig`` and writes it as JSON,
the process parses only that file (every section checked again), and no secret is written. The roles' own code
takes its sections or its view, never the whole run."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlx.config import load_config
from rlx.config.errors import ConfigError
from rlx.config.roles import RolloutRole, TrainerRole, read_role, rollout_role, trainer_role, write_role
from tests.helpers import write_config

RLX = Path(__file__).parents[2] / "rlx"
ROLE_CODE = ["rollout", "trainer", "store", "trace", "placement.py"]
"""Where no function takes the whole ``RunConfig``: the roles and the layers under them."""


def run_config(tmp_path, *overrides):
    path = write_config(tmp_path / "run.yaml", tmp_path / "model")
    return load_config(str(path), ["rollout.auth_token=s3cret", "trainer.seed=7", *overrides])


def test_the_rollout_view_holds_what_a_server_reads(tmp_path):
    cfg = run_config(tmp_path, "placement.sleep_level=2", "rollout.n=4", "trainer.prompts_per_step=3")
    role = rollout_role(cfg)
    assert (role.model, role.rollout, role.sync, role.placement) == (cfg.model, cfg.rollout, cfg.sync, cfg.placement)
    assert (role.seed, role.samples_per_step, role.lora_sync) == (7, 12, cfg.lora_sync)
    assert role.sampling == cfg.sampling
    assert not hasattr(role, "trainer") and not hasattr(role, "task")


def test_the_trainer_view_holds_what_a_rank_reads(tmp_path):
    cfg = run_config(tmp_path, "trainer.mode=one_step_off")
    role = trainer_role(cfg)
    assert (role.model, role.trainer, role.algorithm, role.store) == (cfg.model, cfg.trainer, cfg.algorithm, cfg.store)
    assert role.correction == "bypass" == cfg.correction  # 'auto' resolved once, by the launcher
    assert role.sampling == cfg.sampling and role.teacher_auth_token == "s3cret"
    assert not hasattr(role, "rollout") and not hasattr(role, "task")


@pytest.mark.parametrize(("cut", "kind"), [(rollout_role, RolloutRole), (trainer_role, TrainerRole)])
def test_a_role_file_round_trips_without_its_secret(tmp_path, cut, kind):
    role = cut(run_config(tmp_path))
    path = write_role(role, tmp_path / "roles" / "role.json")
    assert "s3cret" not in path.read_text()
    assert read_role(path, kind, secret="s3cret") == role
    blank = read_role(path, kind)
    assert (blank.rollout.auth_token if kind is RolloutRole else blank.teacher_auth_token) == ""
    assert "s3cret" in (role.rollout.auth_token if kind is RolloutRole else role.teacher_auth_token)  # untouched


def test_a_role_file_is_checked_as_it_is_read(tmp_path):
    path = write_role(rollout_role(run_config(tmp_path)), tmp_path / "rollout0.json")
    data = json.loads(path.read_text())
    data["rollout"]["top_p"] = 3.0
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"rollout.top_p=3.0 must be in \[0.0, 1.0\]"):
        read_role(path, RolloutRole)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the RolloutRole file .*rollout0.json"):
        read_role(path, RolloutRole)


def test_rollout_serve_takes_no_overrides_with_a_role_file(tmp_path):
    path = write_role(rollout_role(run_config(tmp_path)), tmp_path / "rollout0.json")
    result = subprocess.run(
        [sys.executable, "-m", "rlx", "rollout-serve", str(path), "rollout.n=2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "is a rollout role file, which takes no overrides (rollout.n=2)" in " ".join(result.stderr.split())


def _whole_run_params(path: Path, root: Path = RLX.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.annotation is not None and ast.unparse(arg.annotation).strip("'\"") == "RunConfig":
                    found.append(f"{path.relative_to(root)}:{arg.lineno}: {node.name}({arg.arg})")
    return found


def test_no_role_takes_the_whole_run():
    paths = [p for name in ROLE_CODE for p in ([RLX / name] if name.endswith(".py") else (RLX / name).rglob("*.py"))]
    offenders = [hit for path in paths for hit in _whole_run_params(path)]
    assert not offenders, "type these with the sections they read or their role's view:\n" + "\n".join(offenders)


def test_the_whole_run_finder_finds_one(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f(cfg: RunConfig, x: 'RunConfig', y: RolloutRole):\n    pass\n")
    assert _whole_run_params(sample, tmp_path) == ["sample.py:1: f(cfg)", "sample.py:1: f(x)"]
