"""One GPU, colocated placement: the trainer and a transformers rollout engine take turns on it, and offloading
the trainer is what lets both fit.

    python benchmarks/gpu_colocate.py --out OUT_DIR            # on a CUDA host, < 6 minutes
    python benchmarks/gpu_colocate.py --out OUT_DIR --device cpu   # dry run of every step on a CPU

Four `rlx train` runs of configs/gpu_colocated_0p5b.yaml (a random Qwen2-0.5B-shaped model, float32 AdamW
training, bfloat16 hf engine, 2 steps each):

1. calibrate, offload on, the whole GPU; 2. calibrate, offload off, the whole GPU. A thread of this process
   samples the device's used memory (``torch.cuda.mem_get_info``, every 20 ms: both processes, CUDA contexts
   included) and each run's metrics give the per-phase peaks of each process's allocator.
3. offload on and 4. offload off, each on an emulated smaller GPU: this process fills the GPU with a ballast
   tensor until only the budget is free, the midpoint of the two calibrated device peaks. (A per-process
   memory fraction would cap each process alone; turn-taking is about their sum, so the ballast is the honest
   emulation.) Run 3 must finish and run 4 must fail with CUDA out-of-memory.

Prints a table of the per-phase peaks and writes OUT_DIR/gpu_colocate.json; exits non-zero when a run fails
that should pass, run 4 does not run out of memory, or the calibration leaves no room for a budget between the
two. With --device cpu it builds the tiny model, runs 1 and 2 on the CPU (memory is 0 there) and checks the
metrics and exit codes, with no budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "gpu_colocated_0p5b.yaml"
PHASES = ("generate", "train", "sync")
MIN_GAP_GB = 2.0  # the two calibrated peaks must differ by this much for a budget between them to be meaningful


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for runs, logs and gpu_colocate.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=None, help="reuse a built model (default: OUT/model)")
    args = parser.parse_args()
    if args.steps < 2:  # AdamW's state exists only after the first update: step 2 is the one that needs offload
        parser.error(f"--steps={args.steps}: use 2 or more (the optimizer state the offload moves appears at step 1)")
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.model_dir or args.out / "model", args.device)
    report = {"device": device_name(args.device), "model": str(model), "steps": args.steps, "runs": {}}
    failures = []
    calib = {}
    for name, offload in (("offload", True), ("no_offload", False)):
        run = train(args, model, f"calibrate_{name}", offload)
        report["runs"][run["name"]] = run
        calib[name] = run
        if run["code"] != 0:
            failures.append(f"{run['name']} failed (exit {run['code']}); see {run['log']}")
    if args.device == "cuda" and not failures:
        failures += budget_runs(args, model, calib, report)
    if args.device == "cpu":
        failures += check_cpu_metrics(calib)
    print_table(report)
    report["ok"] = not failures
    report["failures"] = failures
    (args.out / "gpu_colocate.json").write_text(json.dumps(report, indent=2) + "\n")
    for failure in failures:
        print(f"FAILED: {failure}")
    print(f"wrote {args.out / 'gpu_colocate.json'}")
    return 1 if failures else 0


def budget_runs(args, model: Path, calib: dict, report: dict) -> list[str]:
    need_on, need_off = calib["offload"]["device_peak_gb"], calib["no_offload"]["device_peak_gb"]
    if need_off - need_on < MIN_GAP_GB:
        return [
            (
                f"offloading saved only {need_off - need_on:.2f} GiB of device memory (peaks {need_on:.2f} vs "
                f"{need_off:.2f} GiB); no budget fits one and not the other"
            )
        ]
    budget = (need_on + need_off) / 2
    report["budget_gb"] = budget
    print(
        f"emulating a GPU with {budget:.2f} GiB free: the midpoint of the device peaks with offload "
        f"({need_on:.2f} GiB) and without ({need_off:.2f} GiB)"
    )
    failures = []
    with Ballast(budget) as ballast:
        report["ballast_gb"] = ballast.gb
        fits = train(args, model, "budget_offload", True)
        oom = train(args, model, "budget_no_offload", False)
    report["runs"].update({fits["name"]: fits, oom["name"]: oom})
    if fits["code"] != 0:
        failures.append(f"with offload the run did not fit {budget:.2f} GiB (exit {fits['code']}); see {fits['log']}")
    if oom["code"] == 0:
        failures.append(f"without offload the run fit {budget:.2f} GiB; expected it to run out of memory")
    elif not oom["out_of_memory"]:
        failures.append(f"without offload the run failed, but not for memory; see {oom['log']}")
    return failures


def train(args, model: Path, name: str, offload: bool) -> dict:
    run_dir = args.out / name
    log = args.out / f"{name}.log"
    overrides = [
        f"model.path={model}",
        f"trainer.output_dir={run_dir}",
        f"trainer.total_steps={args.steps}",
        f"placement.offload={str(offload).lower()}",
        "logging.console=false",
    ]
    if args.device == "cpu":
        overrides += [
            "trainer.device=cpu",
            "rollout.device=cpu",
            "sync.transport=auto",
            "rollout.max_tokens=8",
            "trainer.prompts_per_step=4",
            "rollout.n=4",
        ]
    argv = [sys.executable, "-m", "rlx", "train", str(CONFIG), *overrides]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    print(f"[{name}] rlx train ... placement.offload={str(offload).lower()}", flush=True)
    started = time.perf_counter()
    with DevicePeak(args.device) as peak, open(log, "w") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, check=False).returncode
    text = log.read_text()
    metrics = read_metrics(run_dir)
    row = {
        "name": name,
        "offload": offload,
        "code": code,
        "log": str(log),
        "seconds": time.perf_counter() - started,
        "device_peak_gb": peak.gb,
        "out_of_memory": "out of memory" in text.lower(),
        "phases": phase_peaks(metrics),
    }
    print(f"[{name}] exit {code} in {row['seconds']:.0f} s; device peak {peak.gb:.2f} GiB", flush=True)
    return row


def phase_peaks(metrics: list[dict]) -> dict:
    """The largest per-phase allocator peak over the steps: trainer and engine."""
    out = {}
    for phase in PHASES:
        out[phase] = {
            who: max((m.get(key, 0.0) for m in metrics), default=0.0)
            for who, key in (("trainer", f"mem_peak_{phase}_gb"), ("engine", f"mem_engine_peak_{phase}_gb"))
        }
    return out


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_cpu_metrics(calib: dict) -> list[str]:
    failures = []
    for name, run in calib.items():
        metrics = read_metrics(Path(run["log"]).with_suffix(""))
        keys = [f"mem_peak_{p}_gb" for p in PHASES] + [f"mem_engine_peak_{p}_gb" for p in PHASES]
        if not metrics or any(k not in m for m in metrics for k in keys):
            failures.append(f"{name}: the metrics lack the per-phase memory peaks")
    return failures


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"peak memory per phase, GiB ({report['device']})")
    for column in ("run", "exit", "device peak", *(f"{p}: trainer / engine" for p in PHASES)):
        table.add_column(column, justify="right" if column != "run" else "left")
    for run in report["runs"].values():
        cells = [f"{run['phases'][p]['trainer']:.2f} / {run['phases'][p]['engine']:.2f}" for p in PHASES]
        table.add_row(run["name"], str(run["code"]), f"{run['device_peak_gb']:.2f}", *cells)
    Console(width=150).print(table)
    if "budget_gb" in report:
        print(f"budget: {report['budget_gb']:.2f} GiB free on the GPU (ballast {report['ballast_gb']:.2f} GiB)")


def build_model(path: Path, device: str) -> Path:
    sys.path.insert(0, str(REPO))
    if (path / "config.json").exists():
        return path
    if device == "cpu":
        from rlx.trainer.tiny import build_tiny_model

        return Path(build_tiny_model(path))
    from rlx.trainer.tiny import build_qwen2_0p5b_random

    return Path(build_qwen2_0p5b_random(path))


def device_name(device: str) -> str:
    if device == "cpu":
        import platform

        return f"CPU ({platform.processor() or platform.machine()}), dry run"
    import torch

    return torch.cuda.get_device_name(0)


class DevicePeak:
    """The GPU's used memory at its highest (all processes), sampled every 20 ms while the block runs; the
    memory used when it started (this process's context, any ballast) is left out. 0 on a CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.gb = 0.0
        self._stop = threading.Event()

    def __enter__(self):
        if self.cuda:
            self._base = self._used()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _used(self) -> int:
        import torch

        free, total = torch.cuda.mem_get_info(0)
        return total - free

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.gb = max(self.gb, (self._used() - self._base) / 2**30)
            time.sleep(0.02)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._stop.set()
            self._thread.join()


class Ballast:
    """Fill the GPU until ``free_gb`` GiB are left free for the runs, and release it at the end."""

    def __init__(self, free_gb: float) -> None:
        self.free_gb = free_gb
        self.gb = 0.0

    def __enter__(self):
        import torch

        free, _ = torch.cuda.mem_get_info(0)
        size = free - int(self.free_gb * 2**30)
        if size <= 0:
            raise SystemExit(
                f"the GPU has only {free / 2**30:.2f} GiB free, less than the {self.free_gb:.2f} "
                "GiB budget; run on an idle GPU"
            )
        self.tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
        self.gb = size / 2**30
        return self

    def __exit__(self, *exc) -> None:
        import torch

        del self.tensor
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
