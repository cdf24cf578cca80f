"""The trainer's AdamW step, fused (``rlx.trainer.optim.build_optimizer``) against the per-tensor loop
(``foreach=False``, what rlx used before), on the same parameters and gradients, in alternating rounds.

Models: the quickstart's and the generation-heavy workload's (built on first use, as `rlx train` builds
them), and on CUDA a random Qwen3-0.6B-shaped model in bf16 (``benchmarks/bench_trainer.py``'s). Each round
times ``--steps`` optimizer steps after a warm-up; the table gives the median milliseconds per step.

    python benchmarks/bench_optimizer.py [--rounds 5] [--steps 50] [--threads 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_models() -> dict[str, Path]:
    """The quickstart's and the long workload's model directories (``bench_e2e``'s), built if missing."""
    from benchmarks.bench_e2e import ensure_model, load_cfg

    models = {}
    for name in ("quickstart", "long"):
        cfg = load_cfg(name)
        ensure_model(cfg)
        models[name] = Path(cfg.model.path)
    return models


def load(path: Path, device: str):
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


def measure(path: Path, device: str, rounds: int, steps: int) -> dict:
    from rlx.config.model import ModelConfig
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.optim import build_optimizer

    cfg = RunConfig(model=ModelConfig(path=str(path)), trainer=TrainerConfig(lr=1e-6))
    model = load(path, device)
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator(device=device).manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator, device=device, dtype=p.dtype)
    optimizers = {
        "per-tensor loop": torch.optim.AdamW(
            params, lr=1e-6, betas=tuple(cfg.trainer.betas), weight_decay=cfg.trainer.weight_decay, foreach=False
        ),
        "rlx (fused)": build_optimizer(model, cfg),
    }
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for round_index in range(rounds + 1):  # round 0 warms up (and creates each optimizer's state)
        for name, optimizer in optimizers.items() if round_index % 2 == 0 else reversed(optimizers.items()):
            sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                optimizer.step()
            sync(device)
            if round_index:
                times[name].append((time.perf_counter() - start) / steps * 1e3)
    loop, fused = (statistics.median(times[name]) for name in optimizers)
    return {
        "parameters": sum(p.numel() for p in params),
        "dtype": str(params[0].dtype),
        "device": device,
        "loop_ms": loop,
        "fused_ms": fused,
        "speedup": loop / fused,
        "rounds_ms": times,
    }


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps timed per round")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads on the CPU (the quickstart's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {name: measure(path, "cpu", args.rounds, args.steps) for name, path in cpu_models().items()}
    if torch.cuda.is_available():
        from benchmarks.bench_trainer import QWEN3_0P6B, build_model_dir

        with tempfile.TemporaryDirectory() as tmp:
            model_dir = build_model_dir(Path(tmp) / "qwen3-0.6b", QWEN3_0P6B)
            results["qwen3-0.6b shape"] = measure(model_dir, "cuda", args.rounds, args.steps)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"AdamW step, ms (median of {args.rounds} rounds of {args.steps} steps)")
    for column in ("model", "device", "parameters", "per-tensor loop", "rlx (fused)", "loop / fused"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['device']} {r['dtype'].removeprefix('torch.')}",
            f"{r['parameters'] / 1e6:.1f}M",
            f"{r['loop_ms']:.2f}",
            f"{r['fused_ms']:.2f}",
            f"{r['speedup']:.1f}x",
        )
    Console().print(table)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "threads": args.threads,
                    "torch": torch.__version__,
                    "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                    "results": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
