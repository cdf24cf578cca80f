from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from rlx.config import ConfigError, RunConfig, load_config
from rlx.config.load import all_key_paths

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
runner = CliRunner()


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_there_are_shipped_configs():
    assert any(p.name == "quickstart.yaml" for p in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    assert cfg.model.path


def test_overrides_apply_and_are_typed(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\ntrainer:\n  lr: 1e-4\n")
    cfg = load_config(path, ["trainer.lr=3e-4", "rollout.n=4", "sync.bucket_mb=8"])
    assert cfg.trainer.lr == pytest.approx(3e-4)
    assert cfg.rollout.n == 4 and isinstance(cfg.rollout.n, int)
    assert cfg.sync.bucket_mb == 8


def test_unknown_key_in_file_names_path_and_suggestion(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\ntrainer:\n  learning_rat: 1e-4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "trainer.learning_rat" in str(err.value)


def test_misspelled_key_suggests_nearest(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\n")
    with pytest.raises(ConfigError, match=r"rollout\.temprature.*did you mean 'rollout\.temperature'"):
        load_config(path, ["rollout.temprature=0.7"])


def test_key_in_wrong_section_points_to_right_one(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\n  bucket_mb: 8\n")
    with pytest.raises(ConfigError, match=r"model\.bucket_mb.*sync\.bucket_mb"):
        load_config(path)


def test_wrong_type_names_key_and_value(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\n")
    with pytest.raises(ConfigError, match=r"trainer\.total_steps") as err:
        load_config(path, ["trainer.total_steps=many"])
    assert "many" in str(err.value)


def test_out_of_range_names_key_value_and_allowed(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\n")
    with pytest.raises(ConfigError, match=r"sync\.bucket_mb=0 must be >= 1; set sync\.bucket_mb"):
        load_config(path, ["sync.bucket_mb=0"])
    with pytest.raises(ConfigError, match=r"algorithm\.advantage='ppo2'.*grpo"):
        load_config(path, ["algorithm.advantage=ppo2"])


def test_missing_required_value(tmp_path):
    path = write(tmp_path, "trainer:\n  lr: 1e-4\n")
    with pytest.raises(ConfigError, match=r"model\.path is required"):
        load_config(path)


def test_missing_file_names_path(tmp_path):
    with pytest.raises(ConfigError, match="not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\ntrainer:\n  lr: [1, 2\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"run\.yaml:\d+"):
        load_config(path)


def test_non_loopback_bind_needs_token(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\n")
    with pytest.raises(ConfigError, match="auth_token"):
        load_config(path, ["rollout.host=10.1.2.3"])
    cfg = load_config(path, ["rollout.host=10.1.2.3", "rollout.auth_token=s3cret"])
    assert cfg.rollout.auth_token == "s3cret"


def test_every_field_has_a_docstring():
    import ast

    import rlx.config

    missing = []
    for module in sorted(Path(rlx.config.__file__).parent.glob("*.py")):
        tree = ast.parse(module.read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            body = cls.body
            for i, node in enumerate(body):
                if isinstance(node, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                        missing.append(f"{module.stem}.{cls.name}.{node.target.id}")
    assert not missing, f"fields without a docstring: {missing}"
    assert len(all_key_paths()) > 50


def test_cli_check_rejects_unknown_key_with_suggestion():
    result = runner.invoke(app, ["config", "check", "configs/quickstart.yaml", "trainer.totally_wrong_key=1"])
    assert result.exit_code == 2
    assert "trainer.totally_wrong_key" in result.output
    assert "nearest valid keys" in result.output or "did you mean" in result.output


def test_cli_show_prints_resolved_yaml():
    result = runner.invoke(app, ["config", "show", "configs/quickstart.yaml", "rollout.n=3"])
    assert result.exit_code == 0, result.output
    assert "'n': 3" in result.output
    assert "bucket_mb:" in result.output


def test_names_from_other_frameworks_point_to_the_rlx_key(tmp_path):
    path = write(tmp_path, "model:\n  path: /m\n")
    with pytest.raises(ConfigError, match=r"did you mean 'trainer\.lr'"):
        load_config(path, ["trainer.learning_rate=1e-3"])
    with pytest.raises(ConfigError, match=r"did you mean 'rollout\.n'"):
        load_config(path, ["trainer.num_generations=8"])
