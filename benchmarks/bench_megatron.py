"""trainer.backend=megatron against trainer.backend=fsdp2: the same `rlx train` config, seed, steps and batch.

Each backend is one `rlx train CONFIG trainer.backend=B` run in its own process (one after the other, the order
given by --backends). Per run: the median step, update and weight-sync times (steps after the first), the trainer's
peak GPU memory (the largest `gpu_peak_gb` of any step, 0 on a CPU), the mean train/rollout |dlogp|
(`logprob_diff_mean`), how many syncs ran and how many were verified, the held-out accuracy at the first and last
evaluation, and the reward per step. A run that fails is recorded with the tail of its log and the others go on.
Prints a table and writes JSON (--json) with one object per backend.

    python benchmarks/bench_megatron.py CONFIG [--steps 10] [--override KEY=VALUE ...] [--json OUT.json]
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
BACKENDS = ("megatron", "fsdp2")


def run_backend(config: Path, backend: str, steps: int, overrides: list[str], out: Path, timeout: float) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        str(config),
        f"trainer.backend={backend}",
        f"trainer.output_dir={out}",
        "logging.console=false",
        *overrides,
        f"trainer.total_steps={steps}",
    ]
    from bench_e2e import run_bounded

    log_path = out.with_suffix(".log")
    started = time.perf_counter()
    code = run_bounded(cmd, log_path, timeout)
    wall = time.perf_counter() - started
    metrics = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    result = {"backend": backend, "command": " ".join(["rlx", *cmd[3:]]), "exit": code, "wall_s": wall}
    if code != 0 or not any("time_step" in r for r in rows):
        steps_rows = [r for r in rows if "time_step" in r]
        result["log_tail"] = log_path.read_text()[-4000:]
        result["steps_done"] = len(steps_rows)
        result["dlogp_per_step"] = [round(r["logprob_diff_mean"], 5) for r in steps_rows]
        result["step_s_per_step"] = [round(r["time_step"], 2) for r in steps_rows]
        return result
    return {**result, **summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    """A run's numbers from its metrics.jsonl rows (the module docstring says which)."""
    steps_rows = [r for r in rows if "time_step" in r]
    timed = steps_rows[1:] or steps_rows
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    return dict(
        steps_done=len(steps_rows),
        step_s=statistics.median(r["time_step"] for r in timed),
        update_s=statistics.median(r["time_update"] for r in timed),
        sync_s=statistics.median(r["time_sync"] for r in timed if "time_sync" in r),
        generate_s=statistics.median(r["time_generate"] for r in timed),
        peak_gb=max(r.get("gpu_peak_gb", 0.0) for r in steps_rows),
        dlogp_mean=statistics.fmean(r["logprob_diff_mean"] for r in steps_rows),
        dlogp_per_step=[round(r["logprob_diff_mean"], 5) for r in steps_rows],
        reward_per_step=[round(r["reward_mean"], 4) for r in steps_rows],
        syncs=sum(1 for r in steps_rows if "sync_verified" in r),
        syncs_verified=sum(1 for r in steps_rows if r.get("sync_verified")),
        heldout_start=evals[0][1] if evals else None,
        heldout_end=evals[-1][1] if evals else None,
        evals=evals,
    )


def cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--override", action="append", default=[], help="KEY=VALUE for both runs (repeatable)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take before it is stopped")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the run directories here")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_megatron_") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs = {}
        for backend in args.backends:
            runs[backend] = run_backend(args.config, backend, args.steps, args.override, work / backend, args.timeout)
            print(f"{backend}: exit {runs[backend]['exit']} after {runs[backend]['wall_s']:.0f} s", flush=True)
    print(f"\n{args.config} {' '.join(args.override)}, {args.steps} steps")
    print("| backend | median step | update | sync | peak GPU memory | mean abs dlogp | syncs verified | held-out |")
    print("|---|---|---|---|---|---|---|---|")
    for backend, r in runs.items():
        if "step_s" not in r:
            print(f"| {backend} | failed (exit {r['exit']}, {r['steps_done']} steps) | | | | | | |")
            continue
        heldout = f"{cell(r['heldout_start'], '.3f')} -> {cell(r['heldout_end'], '.3f')}"
        print(
            f"| {backend} | {r['step_s']:.2f} s | {r['update_s']:.2f} s | {r['sync_s']:.3f} s | {r['peak_gb']:.1f} GB "
            f"| {r['dlogp_mean']:.5f} | {r['syncs_verified']}/{r['syncs']} | {heldout} |"
        )
    if args.json:
        from bench_e2e import gpu_name, machine

        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
        report = {
            "command": "python benchmarks/bench_megatron.py " + " ".join(sys.argv[1:]),
            "commit": commit.stdout.strip(),
            "commit_source": "run",
            "machine": machine(),
            "device": gpu_name(),
            "load_before": list(os.getloadavg()),
            "wall_s": time.perf_counter() - started,
            "steps": args.steps,
            "how": "per backend: medians over the steps after the first of time_step, time_update and time_sync; "
            "peak_gb the largest gpu_peak_gb of any step; dlogp_mean the mean over steps of logprob_diff_mean; "
            "heldout_start/end the first and last eval_accuracy of the run",
            **runs,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
