"""trainer.mode=fully_async against sync on the generation-heavy workload, same seeds, alternating order.

Each run is `rlx train configs/bench_long.yaml` (running_sum, vLLM backend; ``--workload quickstart``:
configs/quickstart.yaml, which learns more per step but generates little) timed from start to end;
its final model is scored by bench_e2e's greedy evaluator on the held-out split, so every mode is
judged by the same code. Modes: sync (the rival: on-policy, lock-step) and fully_async with each
``--staleness`` value. Rounds alternate the order of the modes so drift on the machine hits all alike.
The table gives wall time, steps/s, the median phase times that bound the overlap (generation
throughput vs the trainer's logprob + update), and the ratio of sync's wall time to each mode's.

    python benchmarks/bench_async.py [--workload long|quickstart] [--seeds 0] [--steps 40] [--staleness 1 4]
                                     [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_e2e import WORKLOADS, ensure_model, greedy_accuracy, load_cfg, run_rlx  # noqa: E402 - after the repository is on sys.path

PHASES = (
    "time_generate",
    "time_logprob",
    "time_update",
    "time_sync",
    "time_wait_batch",
    "time_producer_idle",
    "staleness_mean",
    "partial_rollout_frac",
    "samples_dropped_stale",
)


def modes(staleness: list[int]) -> dict[str, list[str]]:
    out = {"sync": ["trainer.mode=sync"]}
    for s in staleness:
        out[f"fully_async s={s}"] = ["trainer.mode=fully_async", f"trainer.max_staleness={s}"]
    return out


def run_mode(workload: str, seed: int, out: Path, overrides: list[str], steps: int, cfg) -> dict:
    result = run_rlx(workload, seed, out, [f"trainer.total_steps={steps}", *overrides])
    from rlx.trace.sinks import read_metrics

    rows = [m for m in read_metrics(out / "metrics.jsonl") if "time_step" in m]
    result["phases"] = {k: statistics.median(m[k] for m in rows) for k in PHASES if k in rows[0]}
    result["phases"]["samples_dropped_stale"] = rows[-1].get("samples_dropped_stale", 0.0)
    result["loop_s"] = sum(m["time_step"] for m in rows)
    result["steps"] = len(rows)
    result["eval_accuracy"] = greedy_accuracy(Path(result.pop("model")), cfg)
    return result


def bench(args) -> dict:
    cfg = load_cfg(args.workload, args.override)
    ensure_model(cfg)
    base = greedy_accuracy(Path(cfg.model.path), cfg)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rlx-bench-async-"))
    rows = []
    for seed in args.seeds:
        order = list(modes(args.staleness).items())
        order = order if seed % 2 == 0 else order[::-1]  # alternate by seed: a later run of another seed continues it
        for name, overrides in order:
            print(f"seed {seed}: {name} ...", flush=True)
            out = work / f"{name.replace(' ', '_').replace('=', '')}-seed{seed}"
            result = run_mode(args.workload, seed, out, [*args.override, *overrides], args.steps, cfg)
            result.update(mode=name, seed=seed, gain=result["eval_accuracy"] - base)
            rows.append(result)
            print(
                f"  wall {result['wall_s']:.1f} s, held-out {base:.3f} -> {result['eval_accuracy']:.3f}, "
                f"phases {json.dumps({k: round(v, 3) for k, v in result['phases'].items()})}",
                flush=True,
            )
    flags = [
        a
        for i, a in enumerate(sys.argv[1:])  # no local paths
        if not {"--work-dir", "--json"} & {a, sys.argv[i]}
    ]
    return {
        "workload": args.workload,
        "steps": args.steps,
        "overrides": args.override,
        "start_accuracy": base,
        "rows": rows,
        "machine": args.machine,
        "command": " ".join(["python", "benchmarks/bench_async.py", *flags]),
    }


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{report['workload']}, {report['steps']} steps: held-out accuracy from {report['start_accuracy']:.3f}"
    )
    for col in (
        "mode",
        "seed",
        "wall s",
        "steps/s",
        "loop steps/s",
        "gen s",
        "logprob+update s",
        "wait s",
        "staleness",
        "dropped",
        "held-out",
        "gain",
        "sync/mode wall",
    ):
        table.add_column(col, justify="right")
    sync_wall = {r["seed"]: r["wall_s"] for r in report["rows"] if r["mode"] == "sync"}
    for r in report["rows"]:
        ph = r["phases"]
        ratio = sync_wall.get(r["seed"], float("nan")) / r["wall_s"]
        table.add_row(
            r["mode"],
            str(r["seed"]),
            f"{r['wall_s']:.1f}",
            f"{r['steps'] / r['wall_s']:.3f}",
            f"{r['steps'] / r['loop_s']:.3f}",
            f"{ph.get('time_generate', 0):.2f}",
            f"{ph.get('time_logprob', 0) + ph.get('time_update', 0):.2f}",
            f"{ph.get('time_wait_batch', float('nan')):.2f}",
            f"{ph.get('staleness_mean', 0):.2f}",
            f"{ph.get('samples_dropped_stale', 0):.0f}",
            f"{r['eval_accuracy']:.3f}",
            f"{r['gain']:+.3f}",
            f"{ratio:.2f}x",
        )
    Console(width=200).print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="long")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=40, help="trainer.total_steps of every run")
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 4], help="trainer.max_staleness values")
    p.add_argument("--override", nargs="*", default=[], help="config overrides for every run, e.g. rollout.backend=hf")
    p.add_argument("--work-dir", default="", help="where runs are written (default: a new temporary directory)")
    p.add_argument("--json", default="docs/results/bench_async_long_epyc.json", help="write the report here")
    p.add_argument("--machine", default="2-vCPU AMD EPYC VM", help="where it ran, recorded in the report")
    args = p.parse_args()
    report = bench(args)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
