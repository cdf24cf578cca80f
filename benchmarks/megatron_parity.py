"""trainer.backend=megatron against trainer.backend=fsdp2 on a CPU: the same numbers, and the same learning.

1. Layouts, on the quickstart's model and one fixed batch (float32): the Megatron backend's completion logprobs
   and entropy against the FSDP2 backend's on one rank, and the weights after one update (the same Trainer, loss
   and AdamW), for TP=1 (this process), TP=2 and two data-parallel ranks (two gloo processes, this script
   started again as ``--worker``).
2. Learning: `rlx train configs/quickstart.yaml` with each backend, seeds 0 1 2, every sync verified
   (sync.verify=true), no checkpoints (training alone is compared): held-out accuracy at the start
   and the end of each run, and the medians of its steps' sync, update and whole-step times (the two backends'
   syncs side by side). Seeds alternate which backend runs first.

    python benchmarks/megatron_parity.py [--seeds 0 1 2] [--steps 60] [--json docs/results/megatron_parity_cpu.json]

The quickstart's model is built by its first run (.cache/models/tiny-math-warmstart) when it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUICKSTART = "configs/quickstart.yaml"
MODEL = ROOT / ".cache" / "models" / "tiny-math-warmstart"
LR = 1e-4  # the quickstart's
LAYOUTS = {"tp1": (1, 1), "tp2": (2, 2), "dp2": (1, 2)}  # name: (tensor_parallel, trainer ranks)
BACKENDS = ("fsdp2", "megatron")
PHASES = ("time_sync", "time_update", "time_step")  # the step's phases whose medians a run reports
NO_CHECKPOINTS = ["checkpoint.every=0", "checkpoint.save_final=false"]


def fixed_batch(vocab: int):
    """24 rows, 4 per prompt, prompts of 3..8 tokens and completions of 1..8 (left- and right-padded)."""
    import torch

    from rlx.trainer.batch import build_batch

    gen = torch.Generator().manual_seed(0)
    prompts, completions = [], []
    for row in range(24):
        if row % 4 == 0:
            prompt = torch.randint(3, vocab, (3 + row % 6,), generator=gen).tolist()
        prompts.append(prompt)
        completions.append(torch.randint(3, vocab, (1 + (row * 5) % 8,), generator=gen).tolist())
    logps = [[-1.0] * len(c) for c in completions]
    rewards = [float((row * 7) % 3 == 0) for row in range(24)]
    return build_batch(prompts, completions, logps, rewards, pad_id=0)


def make_trainer(backend: str, num_ranks: int = 1, tensor_parallel: int = 1):
    import torch

    from rlx.config.megatron import MegatronConfig
    from rlx.config.model import ModelConfig
    from rlx.config.roles import trainer_role
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.trainer import Trainer

    torch.manual_seed(0)
    trainer = TrainerConfig(
        device="cpu",
        backend=backend,
        num_ranks=num_ranks,
        lr=LR,
        micro_batch_size=8,
        micro_batch_tokens=0,
        megatron=MegatronConfig(tensor_parallel=tensor_parallel),
    )
    cfg = RunConfig(model=ModelConfig(path=str(MODEL)), trainer=trainer)
    cfg.rollout.n = 4
    return Trainer(trainer_role(cfg))


def scored(trainer) -> dict:
    """Logprobs and entropy of the whole batch, then the weights after one step on it."""
    import torch

    from rlx.trainer.packing import micro_batches

    batch = fixed_batch(int(json.loads((MODEL / "config.json").read_text())["vocab_size"]))
    (mb,) = micro_batches(batch, 0, 1, 0, batch.size)
    with torch.no_grad():
        logp, entropy = trainer._logprobs(trainer.model, mb)
    trainer.step(batch)
    weights = {name: tensor.clone() for name, tensor in trainer.named_tensors()}
    return {"logp": logp, "entropy": entropy, **{f"w.{name}": tensor for name, tensor in weights.items()}}


def worker(tensor_parallel: int, out: str) -> None:
    import torch
    from safetensors.torch import save_file

    from rlx.trainer.ranks import init_distributed

    torch.set_num_threads(1)
    init_distributed("cpu")
    result = scored(make_trainer("megatron", 2, tensor_parallel))
    if torch.distributed.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in result.items()}, out)
    torch.distributed.destroy_process_group()


def two_ranks(tensor_parallel: int) -> dict:
    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result.safetensors"
        env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        command = [sys.executable, __file__, "--worker", str(tensor_parallel), out]
        procs = [subprocess.Popen(command, env=dict(env, RANK=str(rank))) for rank in range(2)]
        try:
            codes = [proc.wait(timeout=600) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if any(codes):
            raise SystemExit(f"a rank of the TP={tensor_parallel} run failed (exit codes {codes})")
        return load_file(out)


def layouts() -> dict:
    reference = scored(make_trainer("fsdp2"))
    rows = {}
    for name, (tp, ranks) in LAYOUTS.items():
        got = scored(make_trainer("megatron")) if ranks == 1 else two_ranks(tp)
        weight_diff = max(float((got[k] - reference[k]).abs().max()) for k in reference if k.startswith("w."))
        rows[name] = {
            "tensor_parallel": tp,
            "ranks": ranks,
            "max_abs_logprob_diff": float((got["logp"] - reference["logp"]).abs().max()),
            "max_abs_entropy_diff": float((got["entropy"] - reference["entropy"]).abs().max()),
            "one_update_max_abs_weight_diff": weight_diff,
        }
    return rows


def train(backend: str, seed: int, steps: int, run_dir: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "rlx",
        "train",
        QUICKSTART,
        f"trainer.backend={backend}",
        f"trainer.seed={seed}",
        f"trainer.total_steps={steps}",
        f"trainer.output_dir={run_dir}",
        "sync.verify=true",
        *NO_CHECKPOINTS,
    ]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, start_new_session=True)
    wall_s = time.perf_counter() - started
    lines = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(line["step"], line["eval_accuracy"]) for line in lines if "eval_accuracy" in line]
    steps = [line for line in lines if "sync_verified" in line]
    synced = [line["sync_verified"] for line in steps]
    return {
        "backend": backend,
        "seed": seed,
        "held_out_start": evals[0][1],
        "held_out_end": evals[-1][1],
        "held_out": evals,
        "syncs": len(synced),
        "syncs_verified": int(sum(synced)),
        "wall_s": round(wall_s, 1),
        **{f"median_{key}_s": statistics.median(line[key] for line in steps) for key in PHASES},
    }


def machine() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{len(names)}-core {names[0]}" if names else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "megatron_parity_cpu.json")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(int(args.worker[0]), args.worker[1])
    load_before = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            order = BACKENDS if seed % 2 == 0 else BACKENDS[::-1]
            for backend in order:
                if not MODEL.is_dir():  # the quickstart's first run builds it
                    train(backend, seed, 1, Path(tmp) / "build")
                runs.append(train(backend, seed, args.steps, Path(tmp) / f"{backend}_{seed}"))
                print(json.dumps({k: runs[-1][k] for k in ("backend", "seed", "held_out_start", "held_out_end")}))
    rows = layouts()
    gains = {b: [r["held_out_end"] - r["held_out_start"] for r in runs if r["backend"] == b] for b in BACKENDS}
    report = {
        "command": "python benchmarks/megatron_parity.py " + " ".join(sys.argv[1:]),
        "commit": subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip(),
        "commit_source": "run",
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "model": "the quickstart's tiny-math-warmstart (float32)",
        "layouts": rows,
        "one_update_lr": LR,
        "runs": runs,
        "summary": {
            "how": "held-out gain = end - start per run, mean over the seeds per backend; a phase's time: the median "
            "over the seeds of each run's median per step",
            **{f"mean_held_out_gain_{b}": sum(g) / len(g) for b, g in gains.items()},
            **{
                f"median_{key}_s_{b}": statistics.median(r[f"median_{key}_s"] for r in runs if r["backend"] == b)
                for key in PHASES
                for b in BACKENDS
            },
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)


def print_table(report: dict) -> None:
    print(f"{'layout':8} {'max |dlogp|':>12} {'max |dH|':>10} {'one-update max |dw|':>20}")
    for name, row in report["layouts"].items():
        print(
            f"{name:8} {row['max_abs_logprob_diff']:12.2e} {row['max_abs_entropy_diff']:10.2e} "
            f"{row['one_update_max_abs_weight_diff']:20.2e}"
        )
    print(f"\n{'backend':9} {'seed':>4} {'held-out start':>15} {'end':>6} {'syncs verified':>15} {'sync ms':>8}")
    for run in report["runs"]:
        print(
            f"{run['backend']:9} {run['seed']:4d} {run['held_out_start']:15.3f} {run['held_out_end']:6.3f} "
            f"{run['syncs_verified']:>7}/{run['syncs']} {1000 * run['median_time_sync_s']:8.1f}"
        )
    print("\n" + ", ".join(f"{k} {v:.4f}" for k, v in report["summary"].items() if k != "how"))


if __name__ == "__main__":
    main()
