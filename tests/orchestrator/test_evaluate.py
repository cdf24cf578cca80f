"""Held-out evaluation, one function for `rlx train` and `rlx eval` (rlx.orchestrator.evaluate): pass@k and maj@k
from the completions the engine drew, `rlx eval` on a Hugging Face directory against the shared vLLM server, and on
a run's final checkpoint, where it gives the accuracy the run logged for its last evaluation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rlx.config.errors import ConfigError
from rlx.orchestrator.evaluate import evaluate_prompts, resolve_model, sampled_metrics
from rlx.tasks import Problem
from tests.helpers import start_rlx, stop_group, write_config

ROWS = [{"question": f"{a}+{b}=", "answer": "====" if (a + b) % 2 else "vvvv"} for a in range(8) for b in range(8)]
"""Prompts the tiny random model answers with runs of one character ('====', 'vvvv', ...), half of them as the
answer wants: a held-out accuracy that is neither 0 nor 1, and moves when training changes the weights."""
TASK = {"name": "gsm8k", "answer_pattern": r"(\S+)", "num_eval": 16, "chat_template": "off"}


class Letters:
    """A task whose answer is a completion's first character, right when it is 'a'."""

    def is_correct(self, completion, problem):
        return completion[:1] == "a"

    def answer_of(self, completion):
        return completion[:1] or None


def test_pass_at_k_and_majority_vote_count_what_was_drawn():
    problems = [Problem(id=i, prompt="", answer="a") for i in range(4)]
    drawn = [["a", "a", "b", "c"], ["b", "b", "a", "a"], ["b", "c", "d", "a"], ["", "", "", ""]]
    metrics = sampled_metrics(Letters(), problems, drawn, 4)
    assert metrics["pass@1"] == pytest.approx((2 + 2 + 1 + 0) / 16)
    assert metrics["pass@4"] == pytest.approx(3 / 4)
    # votes: a wins; b and a tie, b was drawn first; every answer once, b first; no answer at all
    assert metrics["maj@4"] == pytest.approx(1 / 4)


def test_pass_at_k_on_the_engine(vllm_server, tiny_model_dir, tmp_path):
    """k samples per prompt from the shared vLLM server, seeded per prompt: the same draws at a second evaluation,
    greedy accuracy as one completion each, and pass@1 <= pass@k."""
    from rlx.config import load_config
    from rlx.rollout.client import RolloutClient
    from rlx.tasks import build_task

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = load_config(
        write_config(
            tmp_path / "k.yaml",
            tiny_model_dir,
            task={**TASK, "path": str(data), "eval_k": 4},
            rollout={"max_tokens": 4, "temperature": 1.0},
        )
    )
    task = build_task(cfg.task, str(tiny_model_dir))
    client = RolloutClient([vllm_server])

    async def twice():
        args = (client, task, task.eval, cfg.sampling, 0.0, 4)
        return await evaluate_prompts(*args), await evaluate_prompts(*args)

    try:
        first, again = asyncio.run(twice())
    finally:
        client.close()
    assert first == again and set(first) == {"accuracy", "pass@1", "pass@4", "maj@4"}
    assert 0.0 < first["accuracy"] < 1.0 and first["pass@1"] <= first["pass@4"]


@pytest.mark.serial  # the session's engine must hold the weights it loaded: no other test's sync before this one
def test_rlx_eval_on_a_model_directory_through_a_running_server(vllm_server, tiny_model_dir, tmp_path):
    """`rlx eval CONFIG --model DIR` with rollout.servers: the server must serve DIR; the JSON names each metric
    with its count, the model and its weights' digest, the engine and the command; the table is printed."""
    from typer.testing import CliRunner

    from rlx.cli import app

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config = write_config(
        tmp_path / "e.yaml",
        tiny_model_dir,
        task={**TASK, "path": str(data)},
        rollout={"backend": "vllm", "max_tokens": 4, "servers": [vllm_server], "num_servers": 0},
    )
    out = tmp_path / "report.json"
    runner = CliRunner()
    result = runner.invoke(app, ["eval", str(config), "--model", str(tiny_model_dir), "-k", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["model"]["kind"] == "hf" and report["model"]["path"] == str(Path(tiny_model_dir).resolve())
    assert len(report["model"]["sha256"]) == 64 and report["engine"]["backend"] == "vllm"
    assert {name: entry["count"] for name, entry in report["metrics"].items()} == dict.fromkeys(
        ["accuracy", "pass@1", "pass@2", "maj@2"], 16
    )
    assert "accuracy" in result.output and "pass@2" in result.output and "--model" in report["command"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text((Path(tiny_model_dir) / "config.json").read_text())
    for name in Path(tiny_model_dir).glob("*.safetensors"):
        (other / name.name).symlink_to(name)
    refused = runner.invoke(app, ["eval", str(config), "--model", str(other), "--out", str(out)])
    assert refused.exit_code == 2 and f"serves {tiny_model_dir}" in refused.output.replace("\n", "")


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(tiny_model_dir, tmp_path, monkeypatch):
    """--model ORG/NAME is served from its snapshot in huggingface_hub's cache, the commit recorded; an id the
    cache lacks is named, offline, before any server starts."""
    from huggingface_hub import constants

    from tests.formats.test_hub import write_hub_cache

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    commit = write_hub_cache(tmp_path / "hub", "org/tiny", Path(tiny_model_dir))
    source = resolve_model("org/tiny")
    assert source.kind == "hf" and source.revision == commit and source.path.name == commit
    assert source.digest == resolve_model(str(tiny_model_dir)).digest  # the same weights
    with pytest.raises(ConfigError, match="org/absent"):
        resolve_model("org/absent")


def test_model_paths_that_cannot_be_evaluated_are_named(tmp_path):
    with pytest.raises(ConfigError, match="--model .*: no such directory"):
        resolve_model(str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot tell what"):
        resolve_model(str(tmp_path / "empty"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf"])
def test_rlx_eval_of_a_runs_final_checkpoint_gives_the_accuracy_the_run_logged(tiny_model_dir, tmp_path, backend):
    """A run on vLLM trains 2 steps and evaluates the held-out split at its last; `rlx eval` on the run directory
    converts the final checkpoint, serves it on a fresh vLLM engine and gets that accuracy (same prompts, greedy)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        tiny_model_dir,
        task={**TASK, "path": str(data), "eval_k": 2},
        rollout={"backend": backend, "n": 4, "max_tokens": 4},
        trainer={
            "total_steps": 2,
            "prompts_per_step": 4,
            "micro_batch_size": 16,
            "lr": 3e-3,
            "eval_every": 2,
            "output_dir": str(run_dir),
        },
        checkpoint={"every": 2},
    )
    for args in (["train", str(config)], ["eval", str(config), "--model", str(run_dir)]):
        log = tmp_path / f"{args[0]}.log"
        proc = start_rlx(args, log)
        try:
            assert proc.wait(300) == 0, log.read_text()[-4000:]
        finally:
            stop_group(proc)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [row for row in logged if "eval_accuracy" in row][-1]
    report = json.loads((run_dir / "eval" / "step_2.json").read_text())
    assert last["step"] == 2 and report["model"]["kind"] == "run" and report["model"]["step"] == 2
    for name in ("accuracy", "pass@1", "pass@2", "maj@2"):  # the sampled ones from the same seeds
        assert report["metrics"][name] == {"value": last[f"eval_{name}"], "count": 16}, name
        assert report["run_logged"][f"eval_{name}"] == last[f"eval_{name}"]
    assert 0.0 < last["eval_accuracy"] < 1.0


def test_a_prompt_the_engine_would_refuse_is_named_before_any_server_starts(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from rlx.cli import app

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config = write_config(
        tmp_path / "short.yaml",
        tiny_model_dir,
        task={**TASK, "path": str(data)},
        rollout={"backend": "hf", "max_tokens": 1, "max_model_len": 4},
    )
    result = CliRunner().invoke(app, ["eval", str(config), "--model", str(tiny_model_dir)])
    assert result.exit_code == 2 and "leaves no room for a completion" in " ".join(result.output.split())
