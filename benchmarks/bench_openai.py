"""OpenAI endpoint throughput: `rlx rollout-serve --openai-port` (recording episodes) against vLLM's own
OpenAI server, with rlx's ZeroMQ path on the same server as a reference.

All three paths run vLLM's engine on the same model (dtype, memory fraction, context, seed) and get the
same chats with the same sampling, all requests of a round in flight at once:

- ``rlx zmq``: token-id generate requests through ``RolloutClient`` (what the trainer uses);
- ``rlx http``: ``/v1/chat/completions`` with an ``X-Episode-Id`` each, so every request is recorded;
- ``vllm http``: ``vllm serve``'s ``/v1/chat/completions`` (what a user would run instead), given a chat
  template that concatenates the message contents, which is what rlx does for a tokenizer without one.

Rounds alternate between the paths, 1.5 s apart (vLLM's CPU workers poll for a second after their
last step); a row is the median of ``--repeats``. Prints a table and writes JSON (``--json``).

    python benchmarks/bench_openai.py [--model DIR] [--chats 64] [--max-tokens 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlx.net import free_port  # noqa: E402 - after the repository is on sys.path

PLAIN_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def chats(count: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"{i % 97}+{(i * 7) % 89}="}] for i in range(count)]


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", VLLM_LOGGING_LEVEL="WARNING"),
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600.0) -> None:
    import httpx

    deadline = time.time() + timeout_s
    async with httpx.AsyncClient() as client:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[:4]} exited:\n{log.read_text()[-3000:]}")
            try:
                if (await client.get(f"{url}/v1/models", timeout=2.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1.0)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


class Http:
    def __init__(self, url: str, model: str, args, record: bool) -> None:
        import httpx

        self.url, self.model, self.args, self.record = url, model, args, record
        self.client = httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(max_connections=args.chats))
        self.round_index = 0

    async def _one(self, i: int, messages: list[dict]) -> int:
        headers = {"X-Episode-Id": f"r{self.round_index}-{i}"} if self.record else {}
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.args.max_tokens,
            "temperature": 1.0,
            "seed": i,
        }
        reply = await self.client.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
        reply.raise_for_status()
        return reply.json()["usage"]["completion_tokens"]

    async def round(self, batch: list[list[dict]]) -> tuple[float, float]:
        self.round_index += 1
        start_s = time.perf_counter()
        tokens = sum(await asyncio.gather(*(self._one(i, m) for i, m in enumerate(batch))))
        elapsed = time.perf_counter() - start_s
        return tokens / elapsed, len(batch) / elapsed


class Zmq:
    def __init__(self, address: str, model_dir: str, args) -> None:
        from transformers import AutoTokenizer

        from rlx.rollout.client import RolloutClient

        self.client = RolloutClient([address])
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.args = args

    async def round(self, batch: list[list[dict]]) -> tuple[float, float]:
        from rlx.rollout.protocol import SamplingSpec

        start_s = time.perf_counter()
        ids = [self.tokenizer(m[0]["content"], add_special_tokens=False)["input_ids"] for m in batch]
        results = await asyncio.gather(
            *(
                self.client.generate([p], SamplingSpec(temperature=1.0, max_tokens=self.args.max_tokens, seed=i))
                for i, p in enumerate(ids)
            )
        )
        elapsed = time.perf_counter() - start_s
        tokens = sum(len(r[0].samples[0].token_ids) for r in results)
        return tokens / elapsed, len(batch) / elapsed


async def measure(args, model_dir: str, work: Path) -> dict:
    import yaml

    rlx_http, vllm_port = free_port(), free_port()
    config = work / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"path": model_dir},
                "logging": {"console": False},
                "rollout": {"backend": "vllm", "max_model_len": 512, "gpu_memory_utilization": 0.2},
            }
        )
    )
    address = f"ipc://{work}/rlx.sock"
    template = work / "plain.jinja"
    template.write_text(PLAIN_TEMPLATE)
    rlx_proc = start(
        [
            sys.executable,
            "-m",
            "rlx",
            "rollout-serve",
            str(config),
            "--address",
            address,
            "--openai-port",
            str(rlx_http),
        ],
        work / "rlx.log",
    )
    vllm_proc = start(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_dir,
            "--port",
            str(vllm_port),
            "--host",
            "127.0.0.1",
            "--dtype",
            "float32",
            "--seed",
            "0",
            "--gpu-memory-utilization",
            "0.2",
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--chat-template",
            str(template),
            "--served-model-name",
            "tiny",
            "--disable-log-stats",
        ],
        work / "vllm.log",
    )
    try:
        await wait_http(f"http://127.0.0.1:{rlx_http}", rlx_proc, work / "rlx.log")
        await wait_http(f"http://127.0.0.1:{vllm_port}", vllm_proc, work / "vllm.log")
        paths = {
            "rlx zmq": Zmq(address, model_dir, args),
            "rlx http (recording)": Http(f"http://127.0.0.1:{rlx_http}", "tiny", args, record=True),
            "vllm http": Http(f"http://127.0.0.1:{vllm_port}", "tiny", args, record=False),
        }
        batch = chats(args.chats)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for path in paths.values():  # warm-up
            await path.round(batch)
            await asyncio.sleep(1.5)
        for _ in range(args.repeats):
            for name, path in paths.items():
                samples[name].append(await path.round(batch))
                await asyncio.sleep(1.5)
        return {
            name: {
                "tokens_per_s": statistics.median(t for t, _ in rows),
                "requests_per_s": statistics.median(r for _, r in rows),
                "rounds": [list(row) for row in rows],
            }
            for name, rows in samples.items()
        }
    finally:
        stop(rlx_proc)
        stop(vllm_proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: the kit's tiny model, built once)")
    parser.add_argument("--chats", type=int, default=64, help="chat requests per round, all in flight at once")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default="bench_openai.json", help="where to write the results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlx-bench-openai-") as tmp:
        work = Path(tmp)
        model_dir = args.model
        if not model_dir:
            from rlx.trainer.tiny import build_tiny_model

            model_dir = str(build_tiny_model(work / "model"))
        results = asyncio.run(measure(args, model_dir, work))
    reference = results["vllm http"]["tokens_per_s"]
    print(f"{args.chats} chats x {args.max_tokens} tokens, median of {args.repeats} rounds")
    print(f"{'path':<24}{'tokens/s':>12}{'requests/s':>12}{'vs vllm http':>14}")
    for name, row in results.items():
        print(
            f"{name:<24}{row['tokens_per_s']:>12,.0f}{row['requests_per_s']:>12,.1f}"
            f"{row['tokens_per_s'] / reference:>14.3f}"
        )
    Path(args.json).write_text(
        json.dumps(
            {"chats": args.chats, "max_tokens": args.max_tokens, "repeats": args.repeats, "results": results}, indent=2
        )
    )


if __name__ == "__main__":
    main()
