"""On-policy distillation against RL alone on the quickstart: held-out accuracy per step, same seeds, same steps.

Arms (each one `rlx train configs/quickstart_distill.yaml` with the same seed, steps and sampling):
  rl        GRPO on the task reward alone (algorithm.distill.teacher="": the quickstart)
  distill   pure on-policy distillation from the teacher (reward_coef=0, colocated teacher)
  mixed     distillation plus the task's GRPO advantage (reward_coef=1)

The student is the quickstart's warm-started model; the teacher is the same tiny architecture and
tokenizer warm-started 4x longer on the same train split (never the held-out problems), built by
``--build-teacher`` or on the first run. Held-out accuracy (128 problems, greedy) comes from each
run's own evaluations. Prints a table, writes JSON, and draws accuracy per step.

    python benchmarks/bench_distill.py [--steps 30] [--seeds 0] [--arms rl distill mixed]
        [--json docs/results/bench_distill_epyc.json] [--plot docs/distill.png]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlx.trainer.warmstart import RECIPES  # noqa: E402 - after the repository is on sys.path

CONFIG = ROOT / "configs" / "quickstart_distill.yaml"
TEACHER_STEPS = RECIPES["tiny_math_teacher"].steps
ARMS = {
    "rl": ["algorithm.distill.teacher="],
    "distill": ["algorithm.distill.reward_coef=0"],
    "mixed": ["algorithm.distill.reward_coef=1"],
}


def build_teacher(cfg) -> Path:
    """The teacher: the config's teacher_build_if_missing recipe (the student's, warm-started TEACHER_STEPS
    steps, 4x, on the same train split), as `rlx train` builds it."""
    from rlx.trainer.warmstart import build_warmstart

    path = ROOT / cfg.algorithm.distill.teacher
    if not (path / "config.json").is_file():
        print(f"building the teacher into {path} ({TEACHER_STEPS} warm-start steps)")
        build_warmstart(cfg.algorithm.distill.teacher_build_if_missing, path, cfg.task)
    return path


def _machine() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_e2e import machine

    return machine()


def greedy_accuracy(model_dir: Path, cfg) -> float:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_e2e import greedy_accuracy as accuracy

    return accuracy(model_dir, cfg)


def run_arm(arm: str, seed: int, steps: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        str(CONFIG),
        f"trainer.seed={seed}",
        f"trainer.total_steps={steps}",
        f"trainer.output_dir={out}",
        "logging.console=false",
        "checkpoint.save_final=false",
        *ARMS[arm],
    ]
    started = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    kl = [r["distill_reverse_kl"] for r in rows if "distill_reverse_kl" in r]
    step_times = sorted(r["time_step"] for r in rows if "time_step" in r)
    return {
        "arm": arm,
        "seed": seed,
        "curve": curve,
        "wall_s": wall,
        "median_step_s": step_times[len(step_times) // 2],
        "reverse_kl_first_last": [kl[0], kl[-1]] if kl else None,
    }


def draw(results: list[dict], teacher_acc: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        steps, acc = zip(*r["curve"], strict=True)
        ax.plot(steps, acc, marker="o", label=f"{r['arm']} (seed {r['seed']})")
    ax.axhline(teacher_acc, color="grey", linestyle="--", label="teacher")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out accuracy (greedy, 128 problems)")
    ax.set_title("On-policy distillation vs RL alone (tiny_math quickstart)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    from rlx.config import load_config
    from rlx.launch.display import Display
    from rlx.launch.preflight import build_missing

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="draw held-out accuracy per step here (PNG)")
    parser.add_argument("--machine", default="", help="machine label in the JSON (default: from /proc/cpuinfo)")
    parser.add_argument("--build-teacher", action="store_true", help="only build the teacher, then exit")
    args = parser.parse_args()

    cfg = load_config(CONFIG, [])
    if not Path(ROOT / cfg.model.path, "config.json").is_file():
        build_missing(cfg, Display(total_steps=0))
    teacher = build_teacher(cfg)
    if args.build_teacher:
        return
    teacher_acc = greedy_accuracy(teacher, cfg)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_distill_") as tmp:
        for seed in args.seeds:
            order = args.arms if seed % 2 == 0 else list(reversed(args.arms))  # alternate who runs first
            for arm in order:
                results.append(run_arm(arm, seed, args.steps, Path(tmp) / f"{arm}_{seed}"))
                print(f"{arm} seed {seed}: {results[-1]['curve']}", flush=True)
    results.sort(key=lambda r: (r["seed"], list(ARMS).index(r["arm"])))
    print(f"\nteacher held-out accuracy: {teacher_acc:.3f}   ({args.steps} steps, 32 prompts x 8 samples)")
    print(
        "| arm | seed | accuracy at step 0 | "
        + " | ".join(f"step {s}" for s, _ in results[0]["curve"][1:])
        + " | median step | wall |"
    )
    print("|---|---|---|" + "---|" * (len(results[0]["curve"]) - 1) + "---|---|")
    for r in results:
        accs = " | ".join(f"{a:.3f}" for _, a in r["curve"][1:])
        print(
            f"| {r['arm']} | {r['seed']} | {r['curve'][0][1]:.3f} | {accs} | {r['median_step_s']:.2f} s "
            f"| {r['wall_s']:.0f} s |"
        )
    report = {
        "machine": args.machine or _machine(),
        "steps": args.steps,
        "teacher_accuracy": teacher_acc,
        "teacher_warmstart_steps": TEACHER_STEPS,
        "results": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    if args.plot:
        draw(results, teacher_acc, args.plot)


if __name__ == "__main__":
    main()
