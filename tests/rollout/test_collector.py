"""The collector's sampling: every prompt of a step draws from its own random stream."""

from __future__ import annotations

import asyncio

import pytest

from rlx.orchestrator.collector import Collector
from rlx.rollout.client import RolloutClient
from rlx.tasks import Problem


class _Task:
    def reward(self, completion, problem):
        return 0.0

    def is_correct(self, completion, problem):
        return False


def _collector(address: str, tmp_path, tiny_model_dir) -> tuple[Collector, RolloutClient]:
    from rlx.config import load_config
    from tests.helpers import write_config

    cfg = load_config(
        write_config(tmp_path / "c.yaml", tiny_model_dir, rollout={"n": 4, "max_tokens": 6, "temperature": 1.0})
    )
    client = RolloutClient([address])
    return Collector(cfg, client, _Task()), client


@pytest.fixture(params=["vllm", "hf"])
def server(request, tmp_path_factory, tiny_model_dir):
    if request.param == "vllm":
        yield request.getfixturevalue("vllm_server")
        return
    from tests.helpers import serve

    with serve(tiny_model_dir, "hf", tmp_path_factory.mktemp("hf_server")) as (address, _):
        yield address


def test_the_same_prompt_twice_in_a_step_gets_different_samples(server, tmp_path, tiny_model_dir):
    """With one seed for the whole step, sample j of every prompt came from the same stream, so two
    copies of a prompt got identical groups and the batch's samples were correlated across prompts.
    The hf backend batches requests that differ only in their seed and draws all rows from one stream."""
    collector, client = _collector(server, tmp_path, tiny_model_dir)
    try:
        problems = [Problem(id=i, prompt="3+4=", answer="7") for i in range(3)]

        async def twice():
            return await collector.collect(problems, seed=11), await collector.collect(problems, seed=11)

        first, again = asyncio.run(twice())
    finally:
        client.close()
    groups = [first.completions[i * 4 : (i + 1) * 4] for i in range(3)]
    token_groups = [
        tuple(tuple(s.completion_ids.tolist()) for s in first.samples[i * 4 : (i + 1) * 4]) for i in range(3)
    ]
    assert len(set(token_groups)) == 3, f"copies of one prompt drew the same samples: {groups}"
    assert first.completions == again.completions, "the same step seed must give the same samples"


def test_a_seeded_step_larger_than_one_engine_step_generates(vllm_server, tmp_path, tiny_model_dir):
    """Enough prompt tokens in one step that vLLM would split a prefill across engine steps: its CPU
    worker then fails every seeded request ("CPU Generator does not use offset"), so the CPU engine
    runs without chunked prefill."""
    collector, client = _collector(vllm_server, tmp_path, tiny_model_dir)
    prompt = "+".join(["7"] * 40) + "="  # 80 tokens; 48 prompts x 4 samples is about 15k prompt tokens
    try:
        collected = asyncio.run(
            collector.collect([Problem(id=i, prompt=prompt, answer="280") for i in range(48)], seed=5)
        )
    finally:
        client.close()
    assert len(collected.samples) == 48 * 4
    assert sum(int(s.mask().sum()) for s in collected.samples) > 0


def test_a_reward_still_scoring_when_the_run_stops_ends_without_a_traceback():
    """The run can stop (its loop closed) while the reward thread scores a step; the thread then finds nobody
    waiting and ends quietly, where it used to print 'Event loop is closed' with a traceback."""
    import threading
    import types

    scoring, release, errors = threading.Event(), threading.Event(), []

    def score(*args):
        scoring.set()
        release.wait(10)
        return "scored"

    collector = types.SimpleNamespace(
        cfg=types.SimpleNamespace(task=types.SimpleNamespace(reward_timeout_s=0)),
        score=score,
        _timeout_message=lambda limit: f"scoring took over {limit} s",
    )

    async def stopped_while_scoring():
        collector._score_lock = asyncio.Lock()
        task = asyncio.create_task(Collector.score_off_loop(collector))
        await asyncio.to_thread(scoring.wait, 10)
        task.cancel()

    before = threading.excepthook
    threading.excepthook = lambda hook: errors.append(hook.exc_value)
    try:
        asyncio.run(stopped_while_scoring())
        release.set()
        for thread in threading.enumerate():
            if thread.name == "rlx-reward":
                thread.join(10)
    finally:
        threading.excepthook = before
    assert scoring.is_set() and errors == []


def test_rewards_are_scored_as_groups_finish_each_sample_a_span(vllm_server, tmp_path, tiny_model_dir):
    """Group 0's generation waits until group 1 has been scored: it finishes only if a group's rewards are scored as
    soon as it is generated, not after the whole step. Every sample's reward is a span with its duration."""
    import json
    import threading

    from rlx.trace import tracer

    scored = threading.Event()

    class Task(_Task):
        def reward(self, completion, problem):
            if problem.id == 1:
                scored.set()
            return float(problem.id)

    class HeldClient(RolloutClient):
        async def generate(self, prompts, sampling, timeout_s=None, together=0):
            if prompts == ["1+1="]:
                await asyncio.to_thread(scored.wait, 60)
                assert scored.is_set(), "group 1 was not scored while group 0 was still generating"
            return await super().generate(prompts, sampling, timeout_s, together)

    from rlx.config import load_config
    from tests.helpers import write_config

    cfg = load_config(write_config(tmp_path / "c.yaml", tiny_model_dir, rollout={"n": 2, "max_tokens": 4}))
    client = HeldClient([vllm_server])
    tracer.configure(tmp_path / "trace", role="trainer", name="trainer0")
    try:
        collector = Collector(cfg, client, Task())
        problems = [Problem(id=0, prompt="1+1=", answer="2"), Problem(id=1, prompt="2+2=", answer="4")]
        collected = asyncio.run(collector.collect(problems, seed=3))
    finally:
        tracer.close()
        client.close()
    assert [s.reward for s in collected.samples] == [0.0, 0.0, 1.0, 1.0]
    assert collected.metrics["time_reward"] >= 0
    records = [
        json.loads(line) for path in (tmp_path / "trace").rglob("*.jsonl") for line in path.read_text().splitlines()[1:]
    ]
    rewards = [r for r in records if r.get("n") == "reward"]
    assert sorted((r["a"]["problem"], r["a"]["sample"], r["a"]["reward"]) for r in rewards) == [
        (0, 0, 0.0),
        (0, 1, 0.0),
        (1, 0, 1.0),
        (1, 1, 1.0),
    ]
    assert all(r["d"] >= 0 for r in rewards)


def test_a_failing_group_leaves_no_group_running_when_the_step_fails():
    """The first failure ends the step; the other groups are cancelled and awaited first. A group still scoring
    (its reward in a thread) that ends with an error of its own when cancelled was left to the run's event loop
    shutdown, which printed it as an unhandled exception with a traceback."""
    import asyncio

    from rlx.orchestrator.collector import gather_or_cancel

    unhandled = []

    async def fail():
        raise ValueError("reward model unreachable")

    async def still_scoring():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ValueError("the reward thread's own error, surfacing at cancellation") from None

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
        await gather_or_cancel([still_scoring(), fail()])

    with pytest.raises(ValueError, match="unreachable"):
        asyncio.run(main())
    assert not unhandled, unhandled


class _RecordingTask(_Task):
    """Correct when the completion has an even length; records every completion it judged."""

    def __init__(self):
        self.seen: list[str] = []

    def is_correct(self, completion, problem):
        self.seen.append(completion)
        return len(completion) % 2 == 0


def test_sampled_evaluation_draws_the_same_samples_at_every_evaluation(vllm_server, tmp_path, tiny_model_dir):
    """trainer.eval_temperature > 0: each held-out problem is sampled once with a seed of its own that does not
    change between evaluations, so two evaluations of one policy judge the same completions; greedy
    evaluation (the default) gives one completion for every copy of a prompt."""
    from rlx.config import load_config
    from tests.helpers import write_config

    problems = [Problem(id=i, prompt="3+4=", answer="7") for i in range(6)]

    def evaluate_twice(eval_temperature: float) -> list[str]:
        cfg = load_config(
            write_config(
                tmp_path / f"e{eval_temperature}.yaml",
                tiny_model_dir,
                rollout={"n": 4, "max_tokens": 8, "temperature": 1.0},
                trainer={"eval_temperature": eval_temperature},
            )
        )
        task = _RecordingTask()
        client = RolloutClient([vllm_server])
        try:
            collector = Collector(cfg, client, task)

            async def twice():
                return await collector.evaluate(problems), await collector.evaluate(problems)

            first, again = asyncio.run(twice())
        finally:
            client.close()
        assert first == again
        return task.seen

    sampled = evaluate_twice(1.0)
    assert sampled[:6] == sampled[6:]  # the same draws at both evaluations
    assert len(set(sampled[:6])) > 1  # each problem its own stream (the prompts are the same)
    greedy = evaluate_twice(0.0)
    assert len(set(greedy)) == 1
