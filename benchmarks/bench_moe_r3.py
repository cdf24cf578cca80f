"""Rollout routing replay (R3) against the trainer routing by itself, on a tiny MoE on the CPU.

Arms (each one `rlx train configs/moe_tiny.yaml`, same seed, steps and sampling; the hf backend records each
token's experts, the engine samples in bfloat16 and the trainer scores in float32):
  r3    algorithm.routing_replay=r3: the trainer routes every token to the engine's experts
  off   algorithm.routing_replay=record: the trainer routes by itself, as with off; the engine's routes are
        counted (route_disagreement) and replayed in one extra no-grad pass (the same samples' |dlogp| with
        replay, logprob_diff_mean_replayed), which off cannot report
  off_unrecorded  algorithm.routing_replay=off: no routes recorded (what recording costs the step)
  dense the quickstart's dense model of the same width (Qwen2, hidden 128, 2 layers) with the same bfloat16
        engine: the mismatch without any routing

Per run: the mean over steps of the train/rollout logprob mismatch (|dlogp|, logprob_diff_mean) and of
route_disagreement (the share of routed tokens whose experts differ between the engine and the trainer's own
top-k), the median step time, and held-out accuracy (128 problems, greedy) at the first and last evaluation.
Seeds alternate which arm runs first. Prints a table and writes JSON with an ``r3`` and an ``off`` object
(means over seeds) beside every run's rows.

    python benchmarks/bench_moe_r3.py [--steps 30] [--seeds 0 1 2] [--json docs/results/moe_r3_cpu.json]

On a GPU, the MoE arms run another config (a run that fails is recorded with its log's tail):

    python benchmarks/bench_moe_r3.py --config configs/gpu_moe_1b_r3.yaml --steps 10 --seeds 0 --arms r3 off \
        off_unrecorded [--override KEY=VALUE ...] --json docs/results/moe_r3_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

CONFIG = ROOT / "configs" / "moe_tiny.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ARMS = {
    "r3": (CONFIG, ["algorithm.routing_replay=r3"]),
    "off": (CONFIG, ["algorithm.routing_replay=record"]),
    "off_unrecorded": (CONFIG, ["algorithm.routing_replay=off"]),
    "dense": (QUICKSTART, ["model.rollout_dtype=bfloat16"]),
}


def run_arm(
    arm: str, seed: int, steps: int, out: Path, config: Path = CONFIG, overrides: tuple = (), timeout: float = 3600.0
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        str(config if ARMS[arm][0] == CONFIG else ARMS[arm][0]),
        f"trainer.seed={seed}",
        f"trainer.output_dir={out}",
        "logging.console=false",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
        *ARMS[arm][1],
        *overrides,
        f"trainer.total_steps={steps}",
    ]
    from bench_e2e import run_bounded

    code = run_bounded(cmd, out.with_suffix(".log"), timeout)
    metrics = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    steps_rows = [r for r in rows if "time_step" in r]
    if code != 0 or not steps_rows:
        tail = out.with_suffix(".log").read_text()[-4000:]
        return {"arm": arm, "seed": seed, "exit": code, "steps_done": len(steps_rows), "log_tail": tail}
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    routed = [r["route_disagreement"] for r in steps_rows if "route_disagreement" in r]
    replayed = [r["logprob_diff_mean_replayed"] for r in steps_rows if "logprob_diff_mean_replayed" in r]
    return {
        "arm": arm,
        "seed": seed,
        "dlogp_mean": statistics.fmean(r["logprob_diff_mean"] for r in steps_rows),
        "route_disagreement": statistics.fmean(routed) if routed else None,
        "dlogp_mean_replayed": statistics.fmean(replayed) if replayed else None,
        "step_s": statistics.median(r["time_step"] for r in steps_rows),
        "heldout_start": evals[0][1] if evals else None,
        "heldout_end": evals[-1][1] if evals else None,
        "evals": evals,
        "metrics": rows,
    }


def arm_command(arm: str, config: Path, overrides: list[str]) -> list[str]:
    moe = ARMS[arm][0] == CONFIG
    path = (config if moe else ARMS[arm][0]).resolve()
    where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    return [where, *ARMS[arm][1], *(overrides if moe else ())]


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary(runs: list[dict]) -> dict:
    failed = [r for r in runs if "log_tail" in r]
    runs = [r for r in runs if "log_tail" not in r]
    if not runs:
        return {"failed": [{"seed": r["seed"], "exit": r["exit"], "steps_done": r["steps_done"]} for r in failed]}
    keys = ("dlogp_mean", "dlogp_mean_replayed", "route_disagreement", "step_s", "heldout_start", "heldout_end")
    out = {key: None if runs[0][key] is None else statistics.fmean(r[key] for r in runs) for key in keys}
    out["seeds"] = [r["seed"] for r in runs]
    return out


def main() -> None:
    from rlx.config import load_config
    from rlx.launch.display import Display
    from rlx.launch.preflight import build_missing

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--config", type=Path, default=CONFIG, help="the MoE arms' config")
    parser.add_argument("--override", action="append", default=[], help="KEY=VALUE for the MoE arms (repeatable)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take before it is stopped")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    cfg = load_config(args.config, args.override)
    if not Path(ROOT / cfg.model.path, "config.json").is_file():
        build_missing(cfg, Display(total_steps=0))
    load_before = os.getloadavg()
    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_moe_r3_") as tmp:
        for seed in args.seeds:
            for arm in args.arms if seed % 2 == 0 else list(reversed(args.arms)):
                out = Path(tmp) / f"{arm}_{seed}"
                runs.append(run_arm(arm, seed, args.steps, out, args.config, args.override, args.timeout))
                done = runs[-1]
                said = f"|dlogp| {done['dlogp_mean']:.5f}" if "dlogp_mean" in done else f"failed (exit {done['exit']})"
                print(f"{arm} seed {seed}: {said}", flush=True)
    report = {arm: summary([r for r in runs if r["arm"] == arm]) for arm in args.arms}
    print(f"\n{args.config.name} {' '.join(args.override)}, {args.steps} steps, seeds {args.seeds}; means over seeds")
    print("| arm | mean abs dlogp | same samples replayed | route_disagreement | median step | held-out start | end |")
    print("|---|---|---|---|---|---|---|")
    for arm in args.arms:
        s = report[arm]
        if "failed" in s:
            print(f"| {arm} | failed: {s['failed']} | | | | | |")
            continue
        routes = "-" if s["route_disagreement"] is None else f"{s['route_disagreement']:.4f}"
        replayed = "-" if s["dlogp_mean_replayed"] is None else f"{s['dlogp_mean_replayed']:.5f}"
        print(
            f"| {arm} | {s['dlogp_mean']:.5f} | {replayed} | {routes} | {s['step_s']:.2f} s "
            f"| {cell(s['heldout_start'])} | {cell(s['heldout_end'])} |"
        )
    if args.json:
        from bench_e2e import gpu_name, machine

        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
        report.update(
            command="python benchmarks/bench_moe_r3.py " + " ".join(sys.argv[1:]),
            commit=commit.stdout.strip(),
            commit_source="run",
            machine=machine(),
            load_before=list(load_before),
            load_after=list(os.getloadavg()),
            wall_s=time.perf_counter() - started,
            steps=args.steps,
            arms={arm: arm_command(arm, args.config, args.override) for arm in args.arms},
            device=gpu_name(),
            how="each arm's numbers are means over its seeds of the run's mean over steps of |dlogp|, of |dlogp| "
            "with the engine's routes replayed on the same samples (record only) and of route_disagreement, its "
            "median step time and its first and last held-out accuracy; runs holds every run",
            runs=runs,
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
