"""Rollout throughput: tokens/s through `rlx rollout-serve` versus vLLM called in process.

Every path runs the same engine settings (model, dtype, memory fraction, context length, CUDA graphs
or not, seed) on the same prompts with the same sampling, all requests in flight at once: vLLM's
AsyncLLM in this process (the baseline), vLLM's offline ``LLM.generate`` (one call with every prompt,
vLLM's own batch path), and the rlx server, which adds ZeroMQ, msgpack and its bookkeeping. With
``--trace`` another row runs the server with tracing on (the cost of tracing). All engines stay up and
take timed rounds in turn (after one warm-up round each, and 1.5 s apart so the engine that ran last has
stopped polling), so load and drift hit every path alike; a row is the median of ``--repeats``. Prints a
table and writes JSON (``--json``).

    python benchmarks/bench_rollout.py [--model DIR] [--prompts 256] [--n 4] [--max-tokens 64] [--trace]
        [--dtype float32] [--memory 0.2] [--cuda-graphs] [--no-offline]

On a GPU (one engine each, side by side on it): --dtype bfloat16 --memory 0.25 --cuda-graphs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def prompts_for(count: int) -> list[str]:
    return [f"{i % 97}+{(i * 7) % 89}=" for i in range(count)]


class InProcess:
    """vLLM's AsyncLLM in this process: the baseline."""

    def __init__(self, model: str, args) -> None:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_settings(model, args)))
        self.params = SamplingParams(**sampling_settings(args), output_kind=RequestOutputKind.FINAL_ONLY)

    async def _one(self, i: int, prompt: str) -> int:
        final = None
        async for out in self.engine.generate(prompt, self.params, request_id=f"b{time.time_ns()}-{i}"):
            final = out
        return sum(len(c.token_ids) for c in final.outputs)

    async def round(self, prompts: list[str]) -> float:
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(self._one(i, p) for i, p in enumerate(prompts))))
        return tokens / (time.perf_counter() - start)

    def close(self) -> None:
        self.engine.shutdown()
        self.engine = None  # its __del__ shuts down again: now, not during interpreter teardown, where it fails


OFFLINE = "vLLM offline LLM.generate"


def engine_settings(model: str, args) -> dict:
    """The engine every path runs (the rlx server gets the same through its config)."""
    return {
        "model": model,
        "dtype": args.dtype,
        "seed": 0,
        "gpu_memory_utilization": args.memory,
        "max_model_len": 512,
        "enforce_eager": not args.cuda_graphs,
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": True,
    }


def sampling_settings(args) -> dict:
    return {"n": args.n, "temperature": 1.0, "max_tokens": args.max_tokens, "seed": 1, "logprobs": 0}


class Offline:
    """vLLM's offline ``LLM.generate``: every prompt in one call, vLLM's own batch path."""

    def __init__(self, model: str, args) -> None:
        from vllm import LLM, SamplingParams

        self.llm = LLM(**engine_settings(model, args))
        self.params = SamplingParams(**sampling_settings(args))

    async def round(self, prompts: list[str]) -> float:
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, self.params, use_tqdm=False)  # blocks: nothing else runs meanwhile
        tokens = sum(len(c.token_ids) for out in outputs for c in out.outputs)
        return tokens / (time.perf_counter() - start)

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None


class Server:
    """A real `rlx rollout-serve` process and a client: the path rlx train uses."""

    def __init__(self, model: str, args, trace_dir: str | None) -> None:
        from rlx.rollout.client import RolloutClient
        from rlx.rollout.protocol import SamplingSpec
        from tests.helpers import start_rlx, wait_ready, write_config

        work = Path(tempfile.mkdtemp(prefix="rlx-bench-rollout-"))
        rollout = {
            "backend": "vllm",
            "max_model_len": 512,
            "gpu_memory_utilization": args.memory,
            "enforce_eager": not args.cuda_graphs,
        }
        config = write_config(work / "serve.yaml", Path(model), model={"dtype": args.dtype}, rollout=rollout)
        address = f"ipc://{work}/rollout.sock"
        env = {"RLX_TRACE_DIR": trace_dir} if trace_dir else {}
        self.proc = start_rlx(["rollout-serve", str(config), "--address", address], work / "server.log", env)
        wait_ready(address, self.proc, work / "server.log")
        self.client = RolloutClient([address])
        self.sampling = SamplingSpec(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=1)

    async def round(self, prompts: list[str]) -> float:
        start = time.perf_counter()
        results = await self.client.generate(prompts, self.sampling)
        tokens = sum(len(s.token_ids) for r in results for s in r.samples)
        return tokens / (time.perf_counter() - start)

    def close(self) -> None:
        from tests.helpers import stop_group

        self.client.close()
        stop_group(self.proc)


# vLLM's workers busy-poll their message queue for 1 s after their last step before they sleep: on a
# small machine an engine that just finished its round takes a core from the next path's round.
IDLE_GAP_S = 1.5


async def alternate(paths: dict, prompts: list[str], repeats: int) -> dict[str, list[float]]:
    """One warm-up round each, then rounds in turn, so drift and load hit every path alike; a pause
    before each round lets the engine that ran last go idle."""
    for path in paths.values():
        await path.round(prompts)
    rates: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, path in paths.items():
            await asyncio.sleep(IDLE_GAP_S)
            rates[name].append(await path.round(prompts))
    return rates


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="HF model directory (default: a fresh kit-built tiny model)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", action="store_true", help="also measure the server with tracing on")
    parser.add_argument("--dtype", default="float32", help="every engine's dtype (bfloat16 on a GPU)")
    parser.add_argument("--memory", type=float, default=0.2, help="each engine's memory fraction")
    parser.add_argument("--cuda-graphs", action="store_true", help="capture CUDA graphs (a GPU; default: eager)")
    parser.add_argument("--no-offline", action="store_true", help="leave out vLLM's offline LLM.generate row")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # a timeout's SIGTERM closes every engine on the way out
    from rich.console import Console
    from rich.table import Table

    from rlx.trainer.tiny import build_tiny_model

    model = args.model or str(build_tiny_model(Path(tempfile.mkdtemp(prefix="rlx-bench-model-")) / "tiny"))
    prompts = prompts_for(args.prompts)
    paths = {}
    try:  # every server started is stopped, also when a later one fails to start
        paths["rlx rollout-serve"] = Server(model, args, None)
        if args.trace:
            paths["rlx rollout-serve, tracing on"] = Server(model, args, tempfile.mkdtemp(prefix="rlx-trace-"))
        paths["vLLM in process"] = InProcess(model, args)
        if not args.no_offline:
            paths[OFFLINE] = Offline(model, args)
        rows = asyncio.run(alternate(paths, prompts, args.repeats))
    finally:
        for path in paths.values():
            path.close()
    baseline = statistics.median(rows["vLLM in process"])
    table = Table(
        title=f"rollout throughput: {args.prompts} prompts x n={args.n}, max_tokens={args.max_tokens}, "
        f"median of {args.repeats}"
    )
    offline = statistics.median(rows[OFFLINE]) if OFFLINE in rows else None
    for column in ("path", "tokens/s (median)", "rounds", "ratio to in-process", "ratio to offline"):
        table.add_column(column, justify="right" if column != "path" else "left")
    result = {
        "prompts": args.prompts,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "dtype": args.dtype,
        "cuda_graphs": args.cuda_graphs,
        "device": device_name(),
        "rows": {},
    }
    for name, values in rows.items():
        median = statistics.median(values)
        to_offline = median / offline if offline else None
        table.add_row(
            name,
            f"{median:,.0f}",
            " ".join(f"{v:,.0f}" for v in values),
            f"{median / baseline:.3f}",
            f"{to_offline:.3f}" if to_offline else "",
        )
        result["rows"][name] = {
            "tokens_per_s": median,
            "rounds": values,
            "ratio": median / baseline,
            "ratio_to_offline": to_offline,
        }
    Console(width=140).print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_e2e import machine

    return machine()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    main()
