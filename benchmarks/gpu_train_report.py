"""Report of a GPU `rlx train` run: seconds per phase, update tokens/s and model-FLOPs utilisation.

MFU = 6 * N * (tokens through forward+backward per second) / peak, with N the model's parameters
(tied embeddings counted once) and the peak the bf16 matmul rate measured here, in the same run
(8192^3 products after warm-up). Prints a table and writes JSON (--json).

    python benchmarks/gpu_train_report.py RUN_DIR [--json OUT.json] [--skip-steps 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

PHASES = ("time_generate", "time_reward", "time_logprob", "time_update", "time_sync", "time_checkpoint", "time_step")


def bf16_peak_tflops(size: int = 8192, repeats: int = 10) -> float:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def count_params(model_dir: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-steps", type=int, default=1, help="warm-up steps left out of the means")
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r["step"] > args.skip_steps and "time_update" in r]
    config = (args.run_dir / "config.yaml").read_text()
    model_path = next(line.split(":", 1)[1].strip() for line in config.splitlines() if line.strip().startswith("path:"))
    params = count_params(Path(model_path))
    peak = bf16_peak_tflops()
    means = {k: statistics.fmean(r.get(k, 0.0) for r in steps) for k in PHASES}
    tokens_per_s = statistics.fmean(r["update_tokens"] / r["time_update"] for r in steps)
    achieved = 6 * params * tokens_per_s / 1e12
    result = {
        "steps_measured": len(steps),
        "params": params,
        "bf16_peak_tflops": peak,
        "phase_seconds": means,
        "update_tokens_per_s": tokens_per_s,
        "update_tflops": achieved,
        "mfu": achieved / peak,
        "device": torch.cuda.get_device_name(),
        "num_gpus": torch.cuda.device_count(),
    }
    table = Table(title=f"rlx train on {result['device']} ({params / 1e6:.0f}M params, {len(steps)} steps)")
    table.add_column("phase")
    table.add_column("seconds / step", justify="right")
    for key, value in means.items():
        table.add_row(key.removeprefix("time_"), f"{value:.3f}")
    table.add_row("update tokens/s", f"{tokens_per_s:,.0f}")
    table.add_row("update TFLOP/s (6N)", f"{achieved:.1f}")
    table.add_row("bf16 peak TFLOP/s (measured)", f"{peak:.1f}")
    table.add_row("MFU of the update", f"{100 * result['mfu']:.1f}%")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
