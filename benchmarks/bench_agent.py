"""Concurrent multi-turn episodes against the same episodes run one after another (the serial sum).

Each episode is two policy turns on a real rollout server (the tiny model, transformers backend,
built on the fly) with a tool call after the first turn and a reward call at the end; the tool and
the reward each sleep ``--call-s`` (0.2 s) in a worker process, standing in for a sandbox or a
judge. ``concurrent`` runs all ``--episodes`` (32) at once through rlx's episode loop and worker
pools (``rlx.agent``); ``serial`` runs the very same episodes, generation, tool and reward,
one at a time -- what a plain per-sample loop does. Rounds alternate the order. The table gives
wall seconds, episodes/s and the speed-up; ``--json`` writes the rows.

    python benchmarks/bench_agent.py [--episodes 32] [--call-s 0.2] [--rounds 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sleep_tool(arguments: dict) -> str:
    time.sleep(float(arguments["seconds"]))
    return "ok"


def sleep_reward(completion: str, answer: str) -> float:
    time.sleep(float(answer))
    return 1.0


class AlwaysCallsEnv:
    """Calls the sleeping tool after the first turn whatever the policy wrote; done after the second."""

    def __init__(self, pool, call_s: float) -> None:
        self.pool, self.call_s, self.turns = pool, call_s, 0

    async def reset(self, problem) -> str:
        return problem.prompt

    async def step(self, turn):
        from rlx.agent.env import StepResult

        self.turns += 1
        if self.turns == 2:
            return StepResult("", done=True)
        result = await self.pool.call("benchmarks.bench_agent:sleep_tool", {"seconds": self.call_s})
        return StepResult(f"={result.value}\n", done=False)


async def run(address: str, tokenizer, episodes: int, call_s: float, concurrent: bool) -> float:
    from rlx.agent.framing import PlainFraming
    from rlx.agent.workers import WorkerPool
    from rlx.orchestrator.episode_loop import run_episode
    from rlx.rollout.client import RolloutClient
    from rlx.rollout.protocol import SamplingSpec
    from rlx.tasks.base import Problem

    framing = PlainFraming(tokenizer)
    sampling = SamplingSpec(temperature=1.0, max_tokens=8)
    workers = episodes if concurrent else 1
    client = RolloutClient([address])
    tools = await WorkerPool("tool", workers, 30.0, 1024).start()
    rewards = await WorkerPool("reward", workers, 30.0, 1024).start()
    try:

        async def one(i: int) -> None:
            problem = Problem(i, f"{i}*{i + 7}=", str(call_s))
            spec = SamplingSpec(temperature=sampling.temperature, max_tokens=sampling.max_tokens, seed=i * 4)
            episode = await run_episode(client, AlwaysCallsEnv(tools, call_s), problem, framing, spec, 2, 64, 120)
            reward = await rewards.call("benchmarks.bench_agent:sleep_reward", episode.final_text, problem.answer)
            assert reward.ok, reward.error

        start = time.perf_counter()
        if concurrent:
            await asyncio.gather(*(one(i) for i in range(episodes)))
        else:
            for i in range(episodes):
                await one(i)
        return time.perf_counter() - start
    finally:
        await tools.close()
        await rewards.close()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--call-s", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer

    from rlx.trainer.tiny import build_tiny_model
    from tests.helpers import serve

    times: dict[str, list[float]] = {"concurrent": [], "serial": []}
    with tempfile.TemporaryDirectory(prefix="rlx-bench-agent-") as tmp:
        model = build_tiny_model(Path(tmp) / "model")
        tokenizer = AutoTokenizer.from_pretrained(model)
        with serve(model, "hf", Path(tmp)) as (address, _):
            asyncio.run(run(address, tokenizer, 2, args.call_s, concurrent=True))  # warm-up
            for r in range(args.rounds):
                order = ["concurrent", "serial"] if r % 2 == 0 else ["serial", "concurrent"]
                for mode in order:
                    times[mode].append(
                        asyncio.run(
                            run(address, tokenizer, args.episodes, args.call_s, concurrent=mode == "concurrent")
                        )
                    )
    serial = statistics.median(times["serial"])
    rows = [
        {
            "mode": mode,
            "episodes": args.episodes,
            "call_s": args.call_s,
            "wall_s": statistics.median(t),
            "all_wall_s": t,
            "episodes_per_s": args.episodes / statistics.median(t),
            "speedup_vs_serial": serial / statistics.median(t),
        }
        for mode, t in times.items()
    ]
    table = Table(
        title=f"{args.episodes} two-turn episodes, one {args.call_s:g} s tool call + one "
        f"{args.call_s:g} s reward call each (median of {args.rounds})"
    )
    for column in ("mode", "wall s", "episodes/s", "speed-up vs serial"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["mode"], f"{row['wall_s']:.2f}", f"{row['episodes_per_s']:.1f}", f"{row['speedup_vs_serial']:.1f}x"
        )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
