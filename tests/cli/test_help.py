"""`--help` reads right: a flag shows as a flag (not `<bool>`, which reads as taking a value), options with a
fixed set of values list them, the two converters share --workers' meaning, and bare `rlx bench-sync` on a CPU
transport measures the smallest preset only."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlx.cli import app

runner = CliRunner()


def help_of(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["config", "show"],
        ["trace-view"],
        ["bench-sync"],
        ["convert-ckpt"],
        ["fp8-convert"],
        ["rollout-serve"],
        ["plot"],
        ["doctor"],
    ],
)
def test_flags_are_not_labelled_as_taking_a_value(command):
    assert "<bool>" not in help_of(*command)


@pytest.mark.parametrize(
    "command, choices",
    [
        (["convert-ckpt"], ["hf|torch_dist|peft", "auto|float32|bfloat16|float16"]),
        (["fp8-convert"], ["block|channel|tensor"]),
        (["bench-sync"], ["process|server", "shm|cuda_ipc|gloo|nccl", "0.5b|1.5b|7b"]),
        (["trace-view"], ["name|count|total|mean|p50|p99|max|errors|unfinished"]),
    ],
)
def test_options_with_fixed_values_list_them(command, choices):
    text = help_of(*command)
    for listed in choices:
        assert listed in text, text


def test_both_converters_default_workers_to_one_per_core():
    for command in ("convert-ckpt", "fp8-convert"):
        text = " ".join(help_of(command).split())
        assert "0: one per CPU core, plus one" in text and "[default: 0]" in text, text


def test_bare_bench_sync_on_a_cpu_transport_measures_the_smallest_preset(monkeypatch):
    """The presets the command would run, read from the options it builds (the bench itself is stopped there:
    measuring 0.5b takes a minute)."""
    import rlx.bench.sync as bench

    seen = {}

    async def stop(opts, progress):
        seen["presets"] = list(opts.presets)
        raise ValueError("stopped by the test")

    monkeypatch.setattr(bench, "run_bench", stop)
    runner.invoke(app, ["bench-sync"])
    assert seen["presets"] == ["0.5b"]
    runner.invoke(app, ["bench-sync", "--transport", "nccl"])
    assert seen["presets"] == ["0.5b", "1.5b", "7b"]
