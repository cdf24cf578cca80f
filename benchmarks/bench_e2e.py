"""Whole RL runs: `rlx train` against TRL's `GRPOTrainer` on the same model, task and settings.

Each side is one command a user would type, timed from its start to its end (imports, model
load, engine start, training, saving the final model). Both final models are then scored by the
same greedy evaluator (transformers `generate`, in this process) on the task's held-out split, so
the held-out gain does not depend on either side's own evaluation. Seeds (and with ``--rounds`` > 1,
rounds) alternate the order of the two sides, so drift on the machine hits both alike; a seed's
ratios are those of the two sides' medians over its rounds.

Settings shared by both sides (the quickstart's): 32 prompts x 8 samples per step, temperature
1.0, token-mean loss over completion tokens (TRL's `dapo`), group-normalised advantages, PPO clip,
grad clip 1.0, AdamW with a constant learning rate, one optimizer step per batch, no KL, gradient
checkpointing as the workload's ``model.gradient_checkpointing`` says (off; TRL's own default is on). rlx
evaluates nothing mid-run here (`trainer.eval_every=0`), as TRL does not.

Workloads:
  quickstart   configs/quickstart.yaml: tiny_math, 2-layer model, completions of <= 8 tokens.
  long         configs/bench_long.yaml: a generation-heavy run (see that file).

    python benchmarks/bench_e2e.py [--workload quickstart] [--seeds 0 1 2] [--rounds 1] [--sides rlx trl] [--json OUT]
        [--override KEY=VALUE ...]      (the workload's config, both sides: e.g. trainer.lr=3e-4)
        [--rlx-override KEY=VALUE ...]  (rlx only: e.g. rollout.backend=hf)
        [--plot PNG]                    (draw the run: gains per seed, training reward, time ratios)
    python benchmarks/bench_e2e.py --replot REPORT.json [REPORT.json ...] --plot PNG
                                        (draw saved reports, e.g. rlx's sync and fully_async runs, in one figure)

Both sides train on the task's own reward (``task.reward``: exact match for tiny_math, the shaped
step-by-step reward for running_sum); the held-out score is exact match for both.

TRL comes from the `bench` extra: pip install -e ".[bench]".
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

WORKLOADS = {"quickstart": "configs/quickstart.yaml", "long": "configs/bench_long.yaml"}
LOG_EVERY = 10  # steps per window of the mean training reward both sides report


def load_cfg(workload: str, overrides: list[str] = ()):
    from rlx.config import load_config

    return load_config(ROOT / WORKLOADS[workload], list(overrides))


def ensure_model(cfg) -> None:
    """Build the workload's starting model once, before either side is timed."""
    if not Path(cfg.model.path, "config.json").is_file():
        from rlx.launch.display import Display
        from rlx.launch.preflight import build_model

        build_model(cfg, Display(total_steps=0))


def greedy_accuracy(model_dir: Path, cfg) -> float:
    """Held-out accuracy of ``model_dir``, greedy, scored by the task's own ``is_correct``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlx.tasks import build_task

    task = build_task(cfg.task)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hits = 0
    for start in range(0, len(task.eval), 64):
        chunk = task.eval[start : start + 64]
        enc = tok([p.prompt for p in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=cfg.rollout.max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        hits += sum(task.is_correct(text, p) for text, p in zip(texts, chunk, strict=True))
    return hits / len(task.eval)


def run_rlx(workload: str, seed: int, out: Path, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        str(ROOT / WORKLOADS[workload]),
        f"trainer.seed={seed}",
        f"trainer.output_dir={out}",
        "trainer.eval_every=0",
        "checkpoint.every=0",
        "checkpoint.export_hf=true",
        *extra,
    ]
    wall = _timed(cmd, out / "stdout.log")
    from rlx.trace.sinks import read_metrics

    steps = [m for m in read_metrics(out / "metrics.jsonl") if "time_step" in m]
    phases = {
        k: statistics.median(m[k] for m in steps)
        for k in ("time_step", "time_generate", "time_logprob", "time_update", "time_sync")
        if k in steps[0]
    }
    rewards = [m["reward_mean"] for m in steps]
    return {
        "wall_s": wall,
        "step_s": phases.get("time_step"),
        "phases": phases,
        "model": str(out / "hf"),
        "train_reward": [statistics.fmean(rewards[i : i + LOG_EVERY]) for i in range(0, len(rewards), LOG_EVERY)],
    }


def run_trl(workload: str, seed: int, out: Path, overrides: list[str]) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "_trl",
        "--workload",
        workload,
        "--seed",
        str(seed),
        "--out",
        str(out),
        *(f"--override={o}" for o in overrides),
    ]
    wall = _timed(cmd, out / "stdout.log")
    steps = json.loads((out / "step_times.json").read_text())
    logged = json.loads((out / "log_history.json").read_text())
    return {
        "wall_s": wall,
        "step_s": statistics.median(steps),
        "phases": {},
        "model": str(out / "final"),
        "train_reward": [entry["reward"] for entry in logged if "reward" in entry],
    }


def _timed(cmd: list[str], log: Path) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.run(cmd, check=False, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}); see {log}")
    return wall


def trl_main(workload: str, seed: int, out: Path, overrides: list[str]) -> None:
    """TRL's GRPOTrainer with the workload's settings, HF generate in process (TRL's default)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlx.tasks import Problem, build_task

    cfg = load_cfg(workload, overrides)
    task = build_task(cfg.task)
    t, r = cfg.trainer, cfg.rollout
    data = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer, "id": p.id} for p in task.train])

    def reward(completions, answer, id, **_):  # the task's own reward, as rlx's rollout scores it
        return [
            float(task.reward(c, Problem(id=i, prompt="", answer=a)))
            for c, a, i in zip(completions, answer, id, strict=True)
        ]

    rows = t.prompts_per_step * r.n
    accumulation = max(1, rows // t.micro_batch_size)
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=rows // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=r.n,
        max_completion_length=r.max_tokens,
        temperature=r.temperature,
        learning_rate=t.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=t.weight_decay,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        max_grad_norm=t.max_grad_norm,
        beta=0.0,
        epsilon=cfg.algorithm.clip_low,
        epsilon_high=cfg.algorithm.clip_high,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=t.epochs_per_step,
        max_steps=t.total_steps,
        seed=seed,
        gradient_checkpointing=cfg.model.gradient_checkpointing,  # TRL turns it on by default; rlx as configured
        logging_steps=LOG_EVERY,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[StepTimes()]
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    tok.save_pretrained(str(out / "final"))
    (out / "step_times.json").write_text(json.dumps(times))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))  # "reward": mean of each window


def bench(args) -> dict:
    cfg = load_cfg(args.workload, args.override)
    ensure_model(cfg)
    base = greedy_accuracy(Path(cfg.model.path), cfg)
    rows = []
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rlx-bench-e2e-"))
    runs = [(seed, r) for seed in args.seeds for r in range(args.rounds)]
    for i, (seed, r) in enumerate(runs):
        order = list(args.sides) if i % 2 == 0 else list(reversed(args.sides))
        for side in order:
            out = work / f"{side}-seed{seed}-round{r}"
            print(f"seed {seed}, round {r}: {side} ...", flush=True)
            result = (
                run_rlx(args.workload, seed, out, args.override + args.rlx_override)
                if side == "rlx"
                else run_trl(args.workload, seed, out, args.override)
            )
            result.update(side=side, seed=seed, round=r, eval_accuracy=greedy_accuracy(Path(result["model"]), cfg))
            result["gain"] = result["eval_accuracy"] - base
            result["model"] = str(Path(result["model"]).relative_to(work))  # the report names no path of this machine
            rows.append(result)
            print(
                f"  wall {result['wall_s']:.1f} s, step {result['step_s']:.3f} s, "
                f"held-out {base:.3f} -> {result['eval_accuracy']:.3f}",
                flush=True,
            )
    seeds = per_seed(rows)
    return {
        "workload": args.workload,
        "start_accuracy": base,
        "rows": rows,
        "per_seed": seeds,
        "over_seeds": over_seeds(seeds),
        "rounds": args.rounds,
        "overrides": args.override,
        "rlx_overrides": args.rlx_override,
    }


def per_seed(rows: list[dict]) -> list[dict]:
    """Per seed and side, the medians over the rounds; with both sides, rlx's over TRL's."""
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        sides = {}
        for side in ("rlx", "trl"):
            mine = [r for r in rows if r["seed"] == seed and r["side"] == side]
            if mine:
                sides[side] = {key: statistics.median(r[key] for r in mine) for key in ("wall_s", "step_s", "gain")}
        entry = {"seed": seed, **sides}
        if len(sides) == 2:
            entry["wall_ratio"] = sides["rlx"]["wall_s"] / sides["trl"]["wall_s"]
            entry["step_ratio"] = sides["rlx"]["step_s"] / sides["trl"]["step_s"]
            entry["gain_diff"] = sides["rlx"]["gain"] - sides["trl"]["gain"]
        out.append(entry)
    return out


def over_seeds(seeds: list[dict]) -> dict:
    """Across seeds (each its rounds' median): each side's mean gain, and the paired difference rlx - TRL
    with its standard error, so a gap can be told from the seed-to-seed spread of chaotic runs."""
    paired = [s for s in seeds if "gain_diff" in s]
    if not paired:
        return {}
    diffs = [s["gain_diff"] for s in paired]
    return {
        "seeds": len(paired),
        "rlx_gain_mean": statistics.fmean(s["rlx"]["gain"] for s in paired),
        "trl_gain_mean": statistics.fmean(s["trl"]["gain"] for s in paired),
        "gain_diff_mean": statistics.fmean(diffs),
        "gain_diff_stderr": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
        "seeds_rlx_at_or_above": sum(d >= 0 for d in diffs),
        "step_ratio_median": statistics.median(s["step_ratio"] for s in paired),
        "wall_ratio_median": statistics.median(s["wall_ratio"] for s in paired),
    }


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report['workload']}: held-out accuracy from {report['start_accuracy']:.3f}")
    for col in ("side", "seed", "round", "wall s", "median step s", "held-out", "gain"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        table.add_row(
            r["side"],
            str(r["seed"]),
            str(r.get("round", 0)),
            f"{r['wall_s']:.1f}",
            f"{r['step_s']:.3f}",
            f"{r['eval_accuracy']:.3f}",
            f"{r['gain']:+.3f}",
        )
    for entry in report.get("per_seed", []):
        if "step_ratio" in entry:
            table.add_row(
                "rlx/trl",
                str(entry["seed"]),
                "median",
                f"{entry['wall_ratio']:.2f}x",
                f"{entry['step_ratio']:.2f}x",
                "",
                f"{entry['gain_diff']:+.3f}",
            )
    Console().print(table)
    if summary := report.get("over_seeds"):
        stderr = summary["gain_diff_stderr"]
        print(
            f"over {summary['seeds']} seeds: mean gain rlx {summary['rlx_gain_mean']:+.3f}, TRL "
            f"{summary['trl_gain_mean']:+.3f}; rlx - TRL {summary['gain_diff_mean']:+.3f}"
            + (f" +- {stderr:.3f} (standard error)" if stderr is not None else "")
            + f"; rlx at or above TRL on {summary['seeds_rlx_at_or_above']} of {summary['seeds']}; median ratios: "
            f"step {summary['step_ratio_median']:.2f}x, wall {summary['wall_ratio_median']:.2f}x"
        )
    print(f"mean training reward per {LOG_EVERY} steps:")
    for r in report["rows"]:
        print(
            f"  {r['side']:>3} seed {r['seed']} round {r.get('round', 0)}: "
            + " ".join(f"{x:.3f}" for x in r.get("train_reward", []))
        )


def rlx_label(report: dict) -> str:
    """How rlx ran in ``report``: its trainer mode, then any other rlx-only override."""
    overrides = dict(o.split("=", 1) for o in report.get("rlx_overrides", []))
    mode = overrides.pop("trainer.mode", "sync")
    rest = [f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items() if k != "trainer.max_staleness"]
    return f"rlx {mode}" + (f" ({' '.join(rest)})" if rest else "")


def draw(reports: list[dict], out: Path) -> None:
    """One figure of one workload's reports: each seed's held-out gain (rlx against TRL), the mean training
    reward per window over the seeds, and each seed's step and wall ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (gains, curves, ratios) = plt.subplots(1, 3, figsize=(15, 4.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    trl_curves, low, high = [], float("inf"), float("-inf")
    for index, report in enumerate(reports):
        color, label = colors[index % len(colors)], rlx_label(report)
        paired = [s for s in report["per_seed"] if "gain_diff" in s]
        x, y = [s["trl"]["gain"] for s in paired], [s["rlx"]["gain"] for s in paired]
        low, high = min([low, *x, *y]), max([high, *x, *y])
        above = sum(s["gain_diff"] >= 0 for s in paired)
        gains.scatter(x, y, color=color, alpha=0.7, label=f"{label}: at or above TRL on {above} of {len(paired)}")
        rows = [r for r in report["rows"] if r.get("train_reward")]
        rlx = [r["train_reward"] for r in rows if r["side"] == "rlx"]
        trl_curves += [r["train_reward"] for r in rows if r["side"] == "trl"]
        if rlx:
            curves.plot(*window_means(rlx), marker="o", color=color, label=f"{label} ({len(rlx)} runs)")
        seeds = [s["seed"] for s in paired]
        ratios.plot(seeds, [s["step_ratio"] for s in paired], "o", color=color, label=f"{label}: step")
        ratios.plot(seeds, [s["wall_ratio"] for s in paired], "x", color=color, label=f"{label}: wall")
    if trl_curves:
        curves.plot(
            *window_means(trl_curves),
            marker="s",
            color="black",
            linestyle="--",
            label=f"TRL GRPOTrainer ({len(trl_curves)} runs)",
        )
    pad = 0.02
    gains.plot([low - pad, high + pad], [low - pad, high + pad], color="grey", linestyle="--", label="equal gain")
    gains.set(
        xlabel="TRL held-out gain",
        ylabel="rlx held-out gain",
        title=f"{reports[0]['workload']}: held-out gain per seed (from {reports[0]['start_accuracy']:.3f})",
    )
    curves.set(
        xlabel="step",
        ylabel="training reward (mean over seeds)",
        title=f"training reward, mean of each {LOG_EVERY} steps",
    )
    ratios.xaxis.get_major_locator().set_params(integer=True)
    ratios.axhline(1.0, color="grey", linestyle="--")
    ratios.axhline(0.5, color="grey", linestyle=":")
    ratios.set(
        xlabel="seed",
        ylabel="rlx / TRL",
        ylim=(0, max(1.2, ratios.get_ylim()[1])),
        title="rlx / TRL per seed: median step (o), wall (x)",
    )
    for ax in (gains, curves, ratios):
        ax.legend(fontsize=7, framealpha=0.85)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def window_means(curves: list[list[float]]) -> tuple[list[int], list[float]]:
    """The last step of each window and the mean over ``curves`` there (curves cut to the shortest)."""
    length = min(len(c) for c in curves)
    return (
        [(i + 1) * LOG_EVERY for i in range(length)],
        [statistics.fmean(c[i] for c in curves) for i in range(length)],
    )


def replot(paths: list[str], out: Path) -> None:
    reports = [json.loads(Path(p).read_text()) for p in paths]
    workloads = {r["workload"] for r in reports}
    if len(workloads) > 1:
        raise SystemExit(
            f"error: --replot takes reports of one workload, got {sorted(workloads)}; "
            "draw each workload's reports into its own --plot file"
        )
    starts = {round(r["start_accuracy"], 6) for r in reports}
    if len(starts) > 1:
        raise SystemExit(
            f"error: --replot takes reports of one starting model, got held-out start accuracies "
            f"{sorted(starts)} (models built on different machines); draw each into its own --plot file"
        )
    draw(reports, out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_trl":
        p = argparse.ArgumentParser()
        p.add_argument("_trl")
        p.add_argument("--workload", default="quickstart")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--override", action="append", default=[])
        a = p.parse_args()
        trl_main(a.workload, a.seed, a.out, a.override)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="quickstart")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sides", nargs="+", choices=("rlx", "trl"), default=["rlx", "trl"])
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of each side per seed, in alternating order; a seed's times and gain are the medians",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="KEY=VALUE for the workload's config, on both sides (e.g. trainer.lr=3e-4)",
    )
    p.add_argument("--rlx-override", action="append", default=[], help="extra KEY=VALUE for rlx train only")
    p.add_argument("--work-dir", default="", help="where runs are written (default: a new temporary directory)")
    p.add_argument("--json", default="", help="write the report here")
    p.add_argument("--plot", type=Path, default=None, help="draw the report here (PNG)")
    p.add_argument(
        "--replot",
        nargs="+",
        default=[],
        metavar="REPORT",
        help="draw these saved reports (--json files of one workload) into --plot instead of running",
    )
    args = p.parse_args()
    if args.replot:
        if args.plot is None:
            p.error("--replot draws into the file --plot names: add --plot OUT.png")
        return replot(args.replot, args.plot)
    report = bench(args)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.plot:
        draw([report], args.plot)


if __name__ == "__main__":
    main()
