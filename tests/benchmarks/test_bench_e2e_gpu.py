"""`bench_e2e.py`'s GPU layouts: TRL's vLLM set as rlx's engine is, the summary the GPU results report
(samples/s ratio, paired gain difference and its standard error, time to TRL's final accuracy), and a GPU
workload refused on a host without the GPUs it needs, before anything runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_e2e.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_e2e"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_trl_vllm_follows_rlx_engine_layout(bench):
    from rlx.config.roles import rollout_role
    from rlx.placement import plan

    one = bench.WORKLOADS["1gpu"]
    cfg = bench.load_cfg("1gpu", list(one.rlx))
    no_config = bench.load_cfg("1gpu", [*one.rlx, "model.path=/nonexistent"])  # no model to size a KV cache for
    args = bench.trl_vllm_args(one, no_config, 0, 0)
    assert "vllm_importance_sampling_correction" not in args  # TRL's own default (on) unless asked to match rlx
    args = bench.trl_vllm_args(one, no_config, 0, 0, "rlx")
    assert args["vllm_mode"] == "colocate" and args["use_vllm"]
    assert args["vllm_gpu_memory_utilization"] == plan(rollout_role(cfg), cfg.trainer, 1).rollout[0].memory_fraction
    assert args["vllm_enable_sleep_mode"] is (cfg.placement.sleep_level > 0)
    assert args["vllm_max_model_length"] == cfg.rollout.max_model_len
    assert args["vllm_importance_sampling_correction"] is False  # rlx's sync run corrects nothing

    fully_async = bench.WORKLOADS["2gpu_fully_async"]
    cfg = bench.load_cfg("2gpu_fully_async", list(fully_async.rlx))
    args = bench.trl_vllm_args(fully_async, cfg, 8123, 51299, "rlx")
    assert args["vllm_mode"] == "server"
    assert (args["vllm_server_port"], args["vllm_group_port"]) == (8123, 51299)
    assert args["vllm_importance_sampling_correction"] is True  # rlx's fully_async run corrects (bypass)
    assert bench.trl_vllm_args(bench.WORKLOADS["quickstart"], cfg, 0, 0) == {}


def test_trl_gets_the_share_that_holds_rlx_kv_cache(bench, tmp_path):
    """rlx sizes its colocated KV cache to the step; TRL takes a fraction: the one that holds the same KV cache
    and room for the engine's weights and activations, never more than rlx's plan gives."""
    import json

    from rlx.config.roles import rollout_role
    from rlx.placement import kv_cache_bytes, plan

    config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = bench.load_cfg("1gpu", [f"model.path={tmp_path}"])
    kv = kv_cache_bytes(rollout_role(cfg), config)
    h200 = 150 * 10**9
    expected = round((kv + bench.ENGINE_ROOM_GB * 2**30) / h200, 4)
    assert (
        bench.trl_memory_fraction(cfg, 1, h200)
        == expected
        < plan(rollout_role(cfg), cfg.trainer, 1).rollout[0].memory_fraction
    )
    assert (
        bench.trl_memory_fraction(cfg, 1, 2 * 2**30)
        == plan(rollout_role(cfg), cfg.trainer, 1).rollout[0].memory_fraction
    )  # a small GPU


def _row(side, seed, wall, gain, curve=()):
    return {
        "side": side,
        "seed": seed,
        "wall_s": wall,
        "step_s": wall / 10,
        "gain": gain,
        "heldout_start": 0.2,
        "heldout_end": 0.2 + gain,
        "samples_per_s": 5120 / wall,
        "samples_per_s_steps": 512 / (wall / 20),
        "eval_curve": [{"step": s, "at_s": t, "evals_s": e, "accuracy": a} for s, t, e, a in curve],
    }


def test_summary_reports_samples_ratio_paired_gain_and_time_to_trl_final(bench):
    rows = [
        _row("rlx", 0, 50.0, 0.30, [(0, 10.0, 1.5, 0.2), (10, 20.0, 4.0, 0.45), (20, 40.0, 6.0, 0.5)]),
        _row("trl", 0, 100.0, 0.20),
        _row("rlx", 1, 40.0, 0.10, [(0, 8.0, 1.0, 0.2), (10, 30.0, 2.0, 0.25)]),
        _row("trl", 1, 100.0, 0.20),
    ]
    seeds = bench.per_seed(rows)
    assert seeds[0]["samples_ratio"] == pytest.approx(2.0)
    # first evaluation at or above TRL's 0.40, logged at 20 s, of which rlx's own evaluations took 4 s
    assert seeds[0]["rlx_s_to_trl_final"] == pytest.approx(16.0)
    assert seeds[0]["time_to_trl_final_ratio"] == pytest.approx(0.16)
    assert seeds[0]["rlx_s_to_trl_final_with_evals"] == 20.0
    assert seeds[0]["time_to_trl_final_ratio_with_evals"] == pytest.approx(0.2)
    assert seeds[1]["time_to_trl_final_ratio"] is None  # never reached TRL's final accuracy
    summary = bench.over_seeds(seeds)
    assert summary["samples_ratio"] == pytest.approx((2.0 + 2.5) / 2)
    assert summary["samples_ratio_steps"] == pytest.approx((2.0 + 2.5) / 2)  # the steps' rate apart from start-up
    assert summary["gain_diff"] == pytest.approx(0.0)
    assert summary["gain_diff_se"] == pytest.approx(0.1)  # stdev of (+0.1, -0.1) over sqrt(2)
    assert summary["time_to_trl_final_ratio"] is None


def test_the_eval_curve_counts_the_evaluations_up_to_each_point(bench):
    metrics = [
        {"step": 0, "time": 105.0, "eval_accuracy": 0.2, "time_eval": 3.0},
        {"step": 1, "time": 107.0, "time_step": 2.0},
        {"step": 2, "time": 112.0, "time_step": 5.0, "eval_accuracy": 0.3, "time_eval": 2.5},
    ]
    curve = bench.eval_curve(metrics, started=100.0)
    assert curve == [
        {"step": 0, "at_s": 5.0, "evals_s": 3.0, "accuracy": 0.2},
        {"step": 2, "at_s": 12.0, "evals_s": 5.5, "accuracy": 0.3},
    ]
    assert bench.time_to(curve, 0.25) == pytest.approx(6.5)
    assert bench.time_to(curve, 0.25, with_evals=True) == 12.0
    assert bench.time_to(curve, 0.5) is None


def test_a_gpu_workload_on_a_host_without_its_gpus_is_refused_naming_the_fix(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--workload", "2gpu", "--seeds", "0", "--work-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode != 0
    assert "needs 2 GPU(s), this host shows 0" in done.stderr
    assert "quickstart" in done.stderr  # what fits here
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_trl_server_and_trainer_gpus_map_through_the_bench_own_visible_devices(bench, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert bench.gpu_env(0) == {"CUDA_VISIBLE_DEVICES": "2"}
    assert bench.gpu_env(1) == {"CUDA_VISIBLE_DEVICES": "3"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bench.gpu_env(1) == {"CUDA_VISIBLE_DEVICES": "1"}


def _report(tmp_path, name, seeds, **changes):
    rows = [row for seed in seeds for row in (_row("rlx", seed, 50.0, 0.3), _row("trl", seed, 100.0, 0.1 * seed))]
    report = {
        "workload": "2gpu",
        "device": "NVIDIA H200",
        "steps": 10,
        "samples_per_step": 512,
        "overrides": [],
        "rlx_overrides": [],
        "rlx_eval_every": 0,
        "start_accuracy": 0.2,
        "rows": rows,
        **changes,
    }
    path = tmp_path / name
    path.write_text(__import__("json").dumps(report))
    return str(path)


def test_merge_joins_benches_of_other_seeds_and_recomputes_the_summary(bench, tmp_path):
    merged = bench.merge([_report(tmp_path, "a.json", [0, 2]), _report(tmp_path, "b.json", [1])])
    assert [r["seed"] for r in merged["rows"]] == [0, 0, 1, 1, 2, 2]
    assert [s["seed"] for s in merged["per_seed"]] == [0, 1, 2]
    summary = merged["over_seeds"]
    assert summary["seeds"] == 3
    assert summary["samples_ratio"] == pytest.approx(2.0)
    assert summary["gain_diff"] == pytest.approx((0.3 + 0.2 + 0.1) / 3)
    assert summary["gain_diff_se"] == pytest.approx(0.1 / 3**0.5)


def test_merge_refuses_other_settings_and_a_seed_twice(bench, tmp_path):
    a = _report(tmp_path, "a.json", [0])
    with pytest.raises(SystemExit, match="'steps' differ"):
        bench.merge([a, _report(tmp_path, "b.json", [1], steps=20)])
    with pytest.raises(SystemExit, match="seed 0 is in both"):
        bench.merge([a, _report(tmp_path, "c.json", [0])])


def test_the_2gpu_rival_is_refused_without_the_servers_web_stack_naming_the_fix(bench, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "uvicorn" else real(name))
    with pytest.raises(SystemExit, match="needs uvicorn, not installed here: pip install uvicorn"):
        bench.check_trl_server()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(path: Path) -> int:
    import time

    for _ in range(200):
        if path.is_file() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_run_stops_when_the_server_it_needs_exits_and_its_group_is_ended(bench, tmp_path):
    pidfile = tmp_path / "run.pid"
    server = subprocess.Popen(["sleep", "0.5"])
    with pytest.raises(SystemExit, match="TRL's vLLM server exited \\(0\\) while TRL ran"):
        bench._timed(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], tmp_path / "trl" / "stdout.log", watch=server)
    assert not _alive(_wait_for(pidfile))


def test_sigterm_to_the_bench_ends_the_run_it_is_timing(tmp_path):
    pidfile = tmp_path / "run.pid"
    driver = (
        "import signal, sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); import bench_e2e as b; "
        "signal.signal(signal.SIGTERM, b._exit_on_sigterm); "
        f"b._timed(['sh', '-c', 'echo $$ > {pidfile}; exec sleep 60'], Path('{tmp_path}') / 'run.log')"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT)
    run = _wait_for(pidfile)
    proc.send_signal(15)
    assert proc.wait(30) == 128 + 15
    assert not _alive(run)


def test_the_real_size_workload_gives_both_sides_its_shape_and_settings(bench):
    """random1p5b_1gpu: Qwen2.5-1.5B's shape with random weights (what rlx doctor counts), 512 samples of up to 1024
    tokens a step, and TRL's colocated vLLM with the same model length, sleep and gradient checkpointing."""
    from rlx.launch.doctor import _planned_parameter_count

    workload = bench.WORKLOADS["random1p5b_1gpu"]
    cfg = bench.load_cfg("random1p5b_1gpu", [*workload.rlx, "model.path=/nonexistent"])
    assert _planned_parameter_count(cfg.model.build_if_missing) / 1e9 == pytest.approx(1.544, abs=0.001)
    assert cfg.trainer.prompts_per_step * cfg.rollout.n == 512 and cfg.rollout.max_tokens == 1024
    args = bench.trl_vllm_args(workload, cfg, 0, 0)
    assert args["vllm_mode"] == "colocate" and args["vllm_enable_sleep_mode"] is True
    assert args["vllm_max_model_length"] == cfg.rollout.max_model_len >= 1024 + 64
    assert cfg.model.gradient_checkpointing  # TRL's GRPOConfig takes it from the same key (trl_main)


def test_the_7b_workload_trains_in_bfloat16_on_both_sides(bench):
    """random7b_1gpu: Qwen2.5-7B's shape with random weights, its weights, gradients and AdamW state in bfloat16
    (float32 would need 122 GB beside the engine), offloaded while the engine generates; TRL loads the model in
    bfloat16 with bf16=True. The other workloads keep float32 on both sides."""
    import torch

    from rlx.launch.doctor import _planned_parameter_count

    workload = bench.WORKLOADS["random7b_1gpu"]
    cfg = bench.load_cfg("random7b_1gpu", [*workload.rlx, "model.path=/nonexistent"])
    assert _planned_parameter_count(cfg.model.build_if_missing) / 1e9 == pytest.approx(7.616, abs=0.01)
    assert cfg.model.dtype == "bfloat16" and cfg.model.gradient_checkpointing and cfg.placement.offload
    assert cfg.trainer.prompts_per_step * cfg.rollout.n == 256 and cfg.rollout.max_tokens == 1024
    assert bench.trl_precision(cfg) == (torch.bfloat16, True)
    args = bench.trl_vllm_args(workload, cfg, 0, 0)
    assert args["vllm_mode"] == "colocate" and args["vllm_max_model_length"] == cfg.rollout.max_model_len
    small = bench.load_cfg("random1p5b_1gpu", ["model.path=/nonexistent"])
    assert bench.trl_precision(small) == (torch.float32, False)
    mixed = bench.load_cfg("random1p5b_1gpu", ["model.path=/nonexistent", "model.compute_dtype=bfloat16"])
    assert bench.trl_precision(mixed) == (torch.float32, True)
