"""The GPU gate: the one- and two-GPU layouts of `rlx train` in LAYOUTS, each with a real model, checked, measured.

Run on a GPU host (docs/gpu.md says how), from the repository root:

    python scripts/gpu_gate.py --out docs/results [--jobs separate colocated ...] [--seeds 0 1 2] [--steps 20]
    python scripts/gpu_gate.py --out docs/results --merge A/gpu_gate_colocated.json B/gpu_gate_colocated.json

Each job is one `rlx train` of SmolLM2-135M-Instruct on reasoning-gym sums (configs/gpu_smollm2_*.yaml) with
``sync.verify=true``, in its own process group, on GPUs of its own: jobs run side by side when the host has
GPUs enough. Per job it records what the gate asks (held-out accuracy before and after, mean |dlogp| between
the trainer's and the engine's logprobs, syncs and verified syncs, median step and sync time, time per
phase, peak memory, the update's MFU), then looks for leftovers: a process of the run still alive (by the
pids the run recorded), a shared-memory segment or socket it left. The ``resume`` jobs stop a run with
SIGTERM mid-run (measuring how long every process takes to end), resume it from its checkpoint and compare
its end with the uninterrupted run of the same seed. One JSON per layout, ``gpu_gate_<layout>.json``.

Where reasoning-gym is not installed (it builds a C extension), ``--task-jsonl`` names its entries exported
as JSONL (``python -m rlx.tasks.reasoning_gym chain_sum FILE --num 4352 --config JSON``), read by
``task.name=gsm8k``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

H200_BF16_FLOPS = 989e12  # dense bf16 peak of an H100 / H200 SXM
LAYOUTS = {  # name: (config, GPUs, overrides)
    "separate": ("configs/gpu_smollm2_separate.yaml", 2, []),
    "separate_nccl": ("configs/gpu_smollm2_separate.yaml", 2, ["sync.transport=nccl"]),
    "colocated": ("configs/gpu_smollm2_colocated.yaml", 1, []),  # sleep level 2, the trainer stays on the GPU
    "colocated_sleep1": ("configs/gpu_smollm2_colocated.yaml", 1, ["placement.sleep_level=1"]),
    "colocated_offload": (  # the trainer moves to host memory in the engine's turn (a model too big to stay)
        "configs/gpu_smollm2_colocated.yaml",
        1,
        ["placement.sleep_level=1", "placement.offload=true"],
    ),
    "two_ranks": ("configs/gpu_smollm2_two_ranks.yaml", 2, []),
    # four GPUs
    "dp2": ("configs/gpu_smollm2_separate.yaml", 4, ["trainer.num_ranks=2", "rollout.num_servers=2"]),
    "colocated4": ("configs/gpu_smollm2_two_ranks.yaml", 4, ["trainer.num_ranks=4", "rollout.num_servers=4"]),
    # SmolLM2-135M's 9 attention heads split over 3 GPUs, not 2: the real model's tensor-parallel layout is TP=3
    "tp3": ("configs/gpu_smollm2_separate.yaml", 4, ["rollout.tensor_parallel_size=3"]),
    # TP=2 beside two FSDP2 ranks, on a random Qwen2-0.5B shape (14 heads): speed and verified syncs, no learning
    "tp2_random_0p5b": (
        "configs/gpu_random_qwen2_0p5b.yaml",
        4,
        [
            "rollout.backend=vllm",
            "rollout.tensor_parallel_size=2",
            "placement.mode=separate",
            "trainer.num_ranks=2",
            "rollout.max_model_len=512",
        ],
    ),
}


@dataclass
class Job:
    layout: str
    seed: int
    resume: bool = False
    result: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.layout}{'_resume' if self.resume else ''}_s{self.seed}"


def main() -> None:
    args = _parse()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        print(f"[gate] wrote {merge(args.merge, args.out)}")
        return
    args.jobs = check_jobs(args.jobs, _gpu_count())
    jobs = [
        Job(layout, seed) for layout in args.jobs for seed in (args.seeds if layout in args.seeded else args.seeds[:1])
    ]
    jobs += [Job(layout, args.seeds[0], resume=True) for layout in args.resume]
    _prepare(args)
    _run_all(jobs, args)
    left = host_leftovers()
    print(f"[gate] /dev/shm after every job: {left or 'nothing of rlx or vLLM'}", flush=True)
    for layout in {j.layout for j in jobs}:
        _write_layout(layout, [j for j in jobs if j.layout == layout], args, left)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_jobs(jobs: list[str] | None, gpus: int) -> list[str]:
    """The layouts to run: those asked for, or every one this host has GPUs for; a layout that needs more GPUs
    than the host has is refused, naming the ones that fit."""
    fits = [name for name, (_, need, _) in LAYOUTS.items() if need <= gpus]
    if jobs is None:
        if not fits:
            raise SystemExit(f"error: this host shows {gpus} GPU(s); every layout of the gate needs at least one")
        return fits
    too_big = [name for name in jobs if LAYOUTS[name][1] > gpus]
    if too_big:
        raise SystemExit(
            f"error: {', '.join(too_big)} need(s) more GPUs than the {gpus} this host shows; "
            f"run them on a larger host, or pick from: {', '.join(fits) or 'none'}"
        )
    return jobs


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="where gpu_gate_<layout>.json goes")
    p.add_argument("--runs", type=Path, default=None, help="where the runs go (checkpoints: GBs); default OUT/runs")
    p.add_argument(
        "--jobs", nargs="+", default=None, choices=list(LAYOUTS), help="default: every layout this host has GPUs for"
    )
    p.add_argument("--seeded", nargs="*", default=["separate", "colocated"], help="layouts run on every seed")
    p.add_argument("--resume", nargs="*", default=["separate_nccl"], help="layouts stopped mid-run and resumed")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--gguf", default="", help="SmolLM2-135M-Instruct GGUF to import when the model is missing")
    p.add_argument("--task-jsonl", default="", help="reasoning-gym entries as JSONL (where the library is missing)")
    p.add_argument("--timeout-s", type=float, default=420.0, help="the longest one run may take")
    p.add_argument("--extra", nargs="*", default=[], help="overrides for every run")
    p.add_argument(
        "--merge", nargs="+", default=[], metavar="REPORT", help="join reports of one layout (other seeds) into OUT"
    )
    return p.parse_args()


def _prepare(args) -> None:
    model = Path(".cache/models/smollm2-135m-instruct")
    if not (model / "config.json").is_file() and args.gguf:
        subprocess.run([sys.executable, "-m", "rlx", "convert-ckpt", args.gguf, str(model)], check=True)


def _overrides(job: Job, args, run_dir: Path) -> list[str]:
    _, _, layout_overrides = LAYOUTS[job.layout]
    task = []
    if args.task_jsonl:
        task = ["task.name=gsm8k", f"task.path={args.task_jsonl}", "task.num_eval=256"]
    return [
        *layout_overrides,
        *task,
        f"trainer.seed={job.seed}",
        f"trainer.total_steps={args.steps}",
        f"trainer.eval_every={max(args.steps // 2, 1)}",
        f"trainer.output_dir={run_dir}",
        "sync.verify=true",
        f"checkpoint.every={max(args.steps // 2, 1)}",
        *args.extra,
    ]


def _run_all(jobs: list[Job], args) -> None:
    """Jobs side by side, each on GPUs of its own, longest first."""
    import torch

    free = list(range(torch.cuda.device_count()))
    lock = threading.Condition()
    threads = []

    def run(job: Job, gpus: list[int]) -> None:
        try:
            job.result = _run_job(job, gpus, args)
        except Exception as exc:  # noqa: BLE001 - one job's failure is its result
            job.result = {"error": f"{type(exc).__name__}: {exc}"}
        (args.out / f"job_{job.name}.json").write_text(
            json.dumps(job.result, indent=1) + "\n"
        )  # kept if a limit cuts the gate
        print(f"[gate] {job.name} on GPU {gpus}: {json.dumps(job.result)}", flush=True)
        with lock:
            free.extend(gpus)
            lock.notify_all()

    for job in sorted(jobs, key=lambda j: (-LAYOUTS[j.layout][1], j.resume)):
        need = LAYOUTS[job.layout][1]
        with lock:
            lock.wait_for(lambda need=need: len(free) >= need)
            gpus = [free.pop(0) for _ in range(need)]
        thread = threading.Thread(target=run, args=(job, gpus))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


def _run_job(job: Job, gpus: list[int], args) -> dict:
    config = LAYOUTS[job.layout][0]
    run_dir = ((args.runs or args.out / "runs") / job.name).resolve()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=physical_gpus(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")))
    argv = [sys.executable, "-m", "rlx", "train", config, *_overrides(job, args, run_dir)]
    if not job.resume:
        code, seconds = _train(argv, env, run_dir / "gate.log", args.timeout_s)
        return _summary(run_dir, code, seconds, gpus)
    stop_at = max(args.steps // 2, 1)
    code, stop = _train(argv, env, run_dir / "gate.log", args.timeout_s, stop_after_checkpoint=stop_at)
    leftovers_after_sigterm = _leftovers(run_dir)
    code2, seconds = _train([*argv, "--resume"], env, run_dir / "gate-resume.log", args.timeout_s)
    summary = _summary(run_dir, code2, seconds, gpus)
    summary.update(
        sigterm_exit_code=code,
        sigterm_stop_s=stop,
        leftovers_after_sigterm=leftovers_after_sigterm,
        resumed_from_step=stop_at,
    )
    return summary


def physical_gpus(gpus: list[int], visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a job on the gate's ``gpus`` (indices of the GPUs the gate sees), mapped through
    the gate's own ``visible`` list: a gate confined to GPUs 2,3 runs its jobs there, not on GPUs 0,1."""
    from rlx.placement import visible_devices

    return visible_devices(gpus, visible)


def _train(argv, env, log: Path, timeout_s: float, stop_after_checkpoint: int = 0) -> tuple[int, float]:
    """Run `rlx train` in its own process group; with ``stop_after_checkpoint`` send it SIGTERM once that step's
    checkpoint exists and return how long it took to exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        with open(log.parent / "gate.pid", "a") as f:
            f.write(f"{proc.pid}\n")
        try:
            if stop_after_checkpoint:
                checkpoints = log.parent / "checkpoints"
                while proc.poll() is None and time.monotonic() - started < timeout_s:
                    if (checkpoints / f"step_{stop_after_checkpoint:08d}").is_dir():
                        time.sleep(2.0)  # into the next step: its sync runs
                        signalled = time.monotonic()
                        os.kill(proc.pid, signal.SIGTERM)
                        proc.wait(60)
                        return proc.returncode, time.monotonic() - signalled
                    time.sleep(0.2)
            proc.wait(max(timeout_s - (time.monotonic() - started), 1))
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:  # out of time (or interrupted): the group is killed, the leader reads -9
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode, time.monotonic() - started


def _summary(run_dir: Path, code: int, seconds: float, gpus: list[int]) -> dict:
    from rlx.trace.sinks import STEP_PHASES

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "time_step" in r]
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]

    def med(key):
        return statistics.median([r[key] for r in steps if key in r]) if any(key in r for r in steps) else None

    params = _params(run_dir)
    mfu = [
        6 * params * r["update_tokens"] / r["time_update"] / H200_BF16_FLOPS
        for r in steps
        if r.get("time_update") and r.get("update_tokens")
    ]
    return {
        "exit_code": code,
        "wall_s": round(seconds, 1),
        "gpus": gpus,
        "heldout": evals,
        "heldout_start": evals[0][1] if evals else None,
        "heldout_end": evals[-1][1] if evals else None,
        "reward_first5": statistics.mean(r["reward_mean"] for r in steps[:5]) if steps else None,
        "reward_last5": statistics.mean(r["reward_mean"] for r in steps[-5:]) if steps else None,
        "dlogp_mean": statistics.mean(r["logprob_diff_mean"] for r in steps) if steps else None,
        "dlogp_max": max((r["logprob_diff_mean"] for r in steps), default=None),
        "syncs": len(steps),
        "syncs_verified": sum(int(r.get("sync_verified", 0)) for r in steps),
        "step_s": med("time_step"),
        "sync_s": med("time_sync"),
        "phases_s": {k: med(k) for k in (*STEP_PHASES, "time_checkpoint") if med(k) is not None},
        "gpu_peak_gb_rank0": max((r.get("gpu_peak_gb", 0) for r in steps), default=None),
        "mfu_update": statistics.median(mfu) if mfu else None,
        "leftovers": _leftovers(run_dir),
    }


def _params(run_dir: Path) -> int:
    config = json.loads((Path(".cache/models/smollm2-135m-instruct") / "config.json").read_text())
    h, layers, vocab, inter = (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["vocab_size"],
        config["intermediate_size"],
    )
    kv = h * config["num_key_value_heads"] // config["num_attention_heads"]
    return layers * (2 * h * h + 2 * h * kv + 3 * h * inter) + vocab * h


def _leftovers(run_dir: Path) -> dict:
    """What the run left: its recorded processes still alive (the launcher's pid is in gate.pid), the /dev/shm
    segments those processes named (rlx-*-<pid>-*) and the sockets in its run directory. vLLM's own segments
    (psm_*) name no pid: ``host_leftovers`` counts them once every job has ended."""
    pids = [int(p) for p in (run_dir / "gate.pid").read_text().split()] if (run_dir / "gate.pid").is_file() else []
    pids_file = run_dir / "logs" / "pids.json"
    pids += list(json.loads(pids_file.read_text()).values()) if pids_file.is_file() else []
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and _state(pid) not in ("Z", "X")]
    segments = [p.name for p in Path("/dev/shm").glob("rlx-*") if any(f"-{pid}-" in p.name for pid in pids)]
    sockets = [str(p) for p in run_dir.rglob("*.sock")]
    return {
        "processes": alive,
        "segments": segments,
        "sockets": sockets,
        "count": len(alive) + len(segments) + len(sockets),
    }


def host_leftovers() -> list[str]:
    """rlx's and vLLM's segments left in /dev/shm once every job ended."""
    return sorted(p.name for p in Path("/dev/shm").glob("*") if p.name.startswith(("rlx-", "psm_")))


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _write_layout(layout: str, jobs: list[Job], args, host_left: list[str]) -> None:
    import torch
    import vllm

    meta = {
        "device": torch.cuda.get_device_name(0),
        "vllm_version": vllm.__version__,
        "command": _command(layout, args),
        "steps": args.steps,
        "host_leftovers": host_left,
    }
    out = layout_report(layout, {j.name: j.result for j in jobs}, meta)
    (args.out / f"gpu_gate_{layout}.json").write_text(json.dumps(out, indent=1) + "\n")


def layout_report(layout: str, runs: dict[str, dict], meta: dict) -> dict:
    """One layout's report from its jobs' results (``runs``: job name -> result; resumed jobs are named
    ``<layout>_resume_s<seed>``) and ``meta``: device, vllm_version, command, steps, host_leftovers."""
    plain = {name: r for name, r in runs.items() if "_resume_" not in name}
    resumed = [r for name, r in runs.items() if "_resume_" in name]
    ok = [r for r in plain.values() if r.get("exit_code") == 0]
    out = {
        "layout": layout,
        "gpus": LAYOUTS[layout][1],
        "device": meta["device"],
        "backend": "vllm",
        "vllm_version": meta["vllm_version"],
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1, imported)",
        "task": "reasoning-gym chain_sum, 2 terms, 1-2 digits",
        "command": meta["command"],
        "seeds": [int(name.rsplit("_s", 1)[1]) for name in plain],
        "steps": meta["steps"],
        "heldout_start": statistics.mean(r["heldout_start"] for r in ok) if ok else None,
        "heldout_end": statistics.mean(r["heldout_end"] for r in ok) if ok else None,
        "dlogp_mean": statistics.mean(r["dlogp_mean"] for r in ok) if ok else None,
        "syncs": sum(r["syncs"] for r in ok),
        "syncs_verified": sum(r["syncs_verified"] for r in ok),
        "step_s": statistics.median(r["step_s"] for r in ok) if ok else None,
        "sync_s": statistics.median(r["sync_s"] for r in ok) if ok else None,
        "leftovers": sum(r["leftovers"]["count"] for r in runs.values() if "leftovers" in r)
        + len(meta["host_leftovers"]),
        "host_leftovers": meta["host_leftovers"],
        "runs": runs,
    }
    base = next(iter(plain.values()), {})
    if resumed and base:
        r = resumed[0]
        out["resumed_reward_matches"] = (
            r.get("exit_code") == 0
            and abs(r["reward_last5"] - base["reward_last5"]) <= 0.05
            and abs(r["heldout_end"] - base["heldout_end"]) <= 0.05
        )
        out["sigterm_stop_s"] = r.get("sigterm_stop_s")
    return out


def merge(paths: list[str], out_dir: Path) -> Path:
    """One layout's report from reports of the same layout made by separate gates (other seeds, other calls):
    their runs joined and summarised again; the device, versions and steps must agree."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    first = reports[0]
    for key in ("layout", "device", "vllm_version", "steps"):
        differ = {str(r[key]) for r in reports}
        if len(differ) > 1:
            raise SystemExit(f"error: the reports differ in {key} ({', '.join(sorted(differ))}); merge one layout's")
    runs = {name: result for r in reports for name, result in r["runs"].items()}
    left = sorted({path for r in reports for path in r.get("host_leftovers", [])})
    meta = dict(first, host_leftovers=left)
    out = out_dir / f"gpu_gate_{first['layout']}.json"
    out.write_text(json.dumps(layout_report(first["layout"], runs, meta), indent=1) + "\n")
    return out


def _command(layout: str, args) -> str:
    extra = f" --task-jsonl {os.path.relpath(args.task_jsonl)}" if args.task_jsonl else ""
    return f"python scripts/gpu_gate.py --out docs/results --jobs {layout} --steps {args.steps}{extra}"


if __name__ == "__main__":
    main()
