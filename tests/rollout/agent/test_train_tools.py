"""`rlx train` with a multi-turn tool task: bad tool references stop it before any process starts, and a
short run goes end to end with the episode metrics and trace spans."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlx.cli import app
from tests.helpers import write_config
from tests.launch.test_train import assert_no_children_alive, read_metrics, run_to_end

pytestmark = pytest.mark.slow

TOOLS_RUN = {"task": {"name": "calc", "num_eval": 8, "num_train": 64},
             "rollout": {"backend": "hf", "n": 2, "max_tokens": 6},
             "agent": {"max_turns": 2, "max_total_tokens": 32, "tool_workers": 1, "reward_workers": 1},
             "trainer": {"prompts_per_step": 4, "micro_batch_size": 8, "total_steps": 2, "eval_every": 2},
             "checkpoint": {"every": 0, "save_final": False}, "trace": {"enabled": True}}


def tools_config(tmp_path, model_dir, **agent):
    sections = {k: dict(v) for k, v in TOOLS_RUN.items()}
    sections["agent"].update(agent)
    sections["trainer"]["output_dir"] = str(tmp_path / "run")
    return write_config(tmp_path / "run.yaml", model_dir, **sections)


@pytest.mark.parametrize("tools, message", [
    (["no_such_tool_module_xyz:run"], "agent.tools='no_such_tool_module_xyz:run': cannot import module"),
    (["calc", "os.path:no_such_function"], "module 'os.path' has no function 'no_such_function'"),
    (["wolfram"], "agent.tools names 'wolfram', which is neither a built-in tool nor an installed one"),
])
def test_bad_tool_reference_fails_before_any_process_starts(tools, message, tiny_model_dir, tmp_path):
    config = tools_config(tmp_path, tiny_model_dir, tools=tools)
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "logs").exists(), "a process was started before the config was checked"


def test_two_step_tool_run_logs_episode_metrics_and_turn_spans(tiny_model_dir, tmp_path):
    config = tools_config(tmp_path, tiny_model_dir)
    code, log = run_to_end(config, tmp_path, timeout_s=300)
    assert code == 0, log[-4000:]
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir)
    for row in rows[1:]:
        for key in ("turns_per_episode", "tool_calls_per_episode", "tool_call_success_rate", "tool_errors",
                    "tool_timeouts", "reward_errors", "accuracy", "loss"):
            assert key in row, key
        assert 1 <= row["turns_per_episode"] <= 2
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[-1]
    spans = set()
    for trace in (run_dir / "trace").glob("trainer0*.jsonl"):
        for line in trace.read_text().splitlines():
            record = json.loads(line)
            spans.add(record.get("n"))
    assert {"agent.episode", "agent.turn"} <= spans, sorted(s for s in spans if s)
    assert_no_children_alive(run_dir)


def test_fully_async_is_refused_for_multi_turn_tasks(tiny_model_dir, tmp_path):
    config = tools_config(tmp_path, tiny_model_dir)
    result = CliRunner().invoke(app, ["train", str(config), "trainer.mode=fully_async"])
    assert result.exit_code == 2, result.output
    assert "set trainer.mode=sync or one_step_off" in " ".join(result.output.split())
    assert not (tmp_path / "run" / "logs").exists()
