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
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "configs" / "moe_tiny.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ARMS = {
    "r3": (CONFIG, ["algorithm.routing_replay=r3"]),
    "off": (CONFIG, ["algorithm.routing_replay=record"]),
    "off_unrecorded": (CONFIG, ["algorithm.routing_replay=off"]),
    "dense": (QUICKSTART, ["model.rollout_dtype=bfloat16"]),
}


def run_arm(arm: str, seed: int, steps: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        str(ARMS[arm][0]),
        f"trainer.seed={seed}",
        f"trainer.output_dir={out}",
        "logging.console=false",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
        *ARMS[arm][1],
        f"trainer.total_steps={steps}",
    ]
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "time_step" in r]
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
        "heldout_start": evals[0][1],
        "heldout_end": evals[-1][1],
        "evals": evals,
        "metrics": rows,
    }


def summary(runs: list[dict]) -> dict:
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
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    cfg = load_config(CONFIG, [])
    if not Path(ROOT / cfg.model.path, "config.json").is_file():
        build_missing(cfg, Display(total_steps=0))
    load_before = os.getloadavg()
    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_moe_r3_") as tmp:
        for seed in args.seeds:
            for arm in args.arms if seed % 2 == 0 else list(reversed(args.arms)):
                runs.append(run_arm(arm, seed, args.steps, Path(tmp) / f"{arm}_{seed}"))
                print(f"{arm} seed {seed}: |dlogp| {runs[-1]['dlogp_mean']:.5f}", flush=True)
    report = {arm: summary([r for r in runs if r["arm"] == arm]) for arm in args.arms}
    print(f"\n{args.steps} steps, 32 prompts x 8 samples, seeds {args.seeds}; means over seeds")
    print("| arm | mean abs dlogp | same samples replayed | route_disagreement | median step | held-out start | end |")
    print("|---|---|---|---|---|---|---|")
    for arm in args.arms:
        s = report[arm]
        routes = "-" if s["route_disagreement"] is None else f"{s['route_disagreement']:.4f}"
        replayed = "-" if s["dlogp_mean_replayed"] is None else f"{s['dlogp_mean_replayed']:.5f}"
        print(
            f"| {arm} | {s['dlogp_mean']:.5f} | {replayed} | {routes} | {s['step_s']:.2f} s "
            f"| {s['heldout_start']:.3f} | {s['heldout_end']:.3f} |"
        )
    if args.json:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_e2e import machine

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
            arms={arm: [str(ARMS[arm][0].relative_to(ROOT)), *ARMS[arm][1]] for arm in args.arms},
            how="each arm's numbers are means over its seeds of the run's mean over steps of |dlogp|, of |dlogp| "
            "with the engine's routes replayed on the same samples (record only) and of route_disagreement, its "
            "median step time and its first and last held-out accuracy; runs holds every run",
            runs=runs,
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
