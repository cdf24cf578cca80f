"""Tools and rewards in worker processes: a hung, crashing, huge or memory-hungry call costs its sample only."""

from __future__ import annotations

import asyncio
import os

from rlx.agent.env import ToolEnv, ToolStats
from rlx.agent.episode import Turn
from rlx.agent.workers import WorkerPool
from rlx.tasks.base import Problem

T = "tests.agent.agent_tools"
TOOLS = {name: f"{T}:{name}" for name in ("hang", "crash", "huge", "hog", "shout", "spew")} | {
    "calc": "rlx.agent.tools:calc"
}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_misbehaving_tools_become_error_observations_and_the_pool_goes_on():
    async def main():
        stats = ToolStats()
        async with WorkerPool("tool", 3, timeout_s=1.0, memory_mb=512, max_output_chars=100) as pool:
            env = ToolEnv(TOOLS, pool, "plain", stats)
            await env.reset(Problem(0, "1*2=", "2"))
            pids_before = {w.process.pid for w in pool._all}

            async def step(text):
                return await env.step(Turn(token_ids=[], logprobs=[], text=text))

            # the hang, the crash and a good call run at once; the good one is not held up
            hung, crashed, good = await asyncio.gather(
                step("<hang>1</hang>"), step("<crash>1</crash>"), step("<calc>6*7</calc>")
            )
            assert "timed out" in hung.observation and not hung.done
            assert "crashed" in crashed.observation
            assert good.observation == "=42\n" and good.tool_calls[0].ok
            huge = await step("<huge>1</huge>")
            assert huge.tool_calls[0].ok and len(huge.observation) < 200 and "truncated" in huge.observation
            hog = await step("<hog>1</hog>")
            assert "MemoryError" in hog.observation and not hog.tool_calls[0].ok
            noisy = await step("<shout>ab</shout>")
            assert noisy.observation == "=AB\n"
            bad = await step("<nosuch>1</nosuch>")
            assert "unknown tool 'nosuch'" in bad.observation
            assert (await step("the answer is 42")).done
            # the hung and the crashed workers were replaced; the killed ones are gone
            assert pool.replaced == 2
            gone = pids_before - {w.process.pid for w in pool._all}
            assert len(gone) == 2 and not any(alive(pid) for pid in gone)
            assert (await step("<calc>2+3</calc>")).observation == "=5\n"
            pids = [w.process.pid for w in pool._all]
        assert not any(alive(pid) for pid in pids)
        assert (stats.calls, stats.ok, stats.timeouts, stats.errors) == (8, 4, 1, 3)

    asyncio.run(main())


def test_hermes_calls_and_malformed_json():
    async def main():
        async with WorkerPool("tool", 1, timeout_s=5.0, memory_mb=512) as pool:
            env = ToolEnv(TOOLS, pool, "hermes", ToolStats())
            ok = await env.step(
                Turn([], [], text='<tool_call>{"name": "calc", "arguments": {"expression": "3*47+5"}}</tool_call>')
            )
            assert ok.observation == "<tool_response>\n146\n</tool_response>\n"
            two = await env.step(
                Turn(
                    [],
                    [],
                    text='<tool_call>{"name": "calc", "arguments": {"expression": "2*3"}}'
                    '</tool_call><tool_call>{"name": "shout", "arguments": '
                    '{"expression": "hi"}}</tool_call>',
                )
            )
            assert two.observation == "<tool_response>\n6\n</tool_response>\n<tool_response>\nHI\n</tool_response>\n"
            bad = await env.step(Turn([], [], text='<tool_call>{"name": calc}</tool_call>'))
            assert "malformed tool call: invalid JSON" in bad.observation and not bad.done

    asyncio.run(main())


def test_a_hung_or_failing_reward_gives_the_sample_zero_and_is_counted(tmp_path):

    from rlx.agent.episode import Episode
    from rlx.orchestrator.episodes import EpisodeCollector

    async def main():
        collector = EpisodeCollector.__new__(EpisodeCollector)
        problem = Problem(0, "6*7=", "42")
        episode = Episode(prompt_ids=[1], turns=[Turn([5], [-0.1], text="42")])
        errors = [0]
        async with WorkerPool("reward", 2, timeout_s=1.0, memory_mb=512) as pool:
            collector.reward_ref = f"{T}:hanging_reward"
            hung = await collector._reward(episode, problem, pool, errors)
            collector.reward_ref = f"{T}:exact_reward"
            scored = await collector._reward(episode, problem, pool, errors)
            collector.reward_ref = f"{T}:no_such_function"
            missing = await collector._reward(episode, problem, pool, errors)
        assert (hung, scored, missing, errors[0]) == (0.0, 1.0, 0.0, 2)

    asyncio.run(main())


def test_a_call_that_prints_megabytes_shows_only_its_first_bytes_and_a_note(capfd):
    async def main():
        async with WorkerPool("tool", 1, timeout_s=30.0, memory_mb=512, max_log_bytes=5000) as pool:
            spewed = await pool.call(TOOLS["spew"], {"expression": "8"})  # 16 MB of output
            shouted = await pool.call(TOOLS["shout"], {"expression": "next"})  # the next call shows its own
            return spewed, shouted

    spewed, shouted = asyncio.run(main())
    assert spewed.ok and spewed.value == "done" and shouted.ok and shouted.value == "NEXT"
    err = capfd.readouterr().err
    assert len(err) < 10_000, f"{len(err)} bytes reached the console"
    assert err.count("printed more than 5000 bytes") == 1 and "agent.max_worker_output_bytes" in err, err[-500:]
    assert err.startswith("spew spew") and err.rstrip().endswith("noise on stdout must not corrupt the reply"), err
