"""Reward models (``task.reward_model``): a judge served by a real hf `rlx rollout-serve` scores a whole step in
one Generate request; a tiny sequence classifier's batched scores equal per-sample forwards; bad settings are
refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import re
import time
from types import SimpleNamespace

import pytest
import torch

from rlx.config.errors import ConfigError
from rlx.config.reward_models import RewardModelConfig
from rlx.rollout import protocol as p
from rlx.rollout.client import RolloutClient
from rlx.tasks.reward_models import RewardModelError
from rlx.tasks.reward_models.classifier import Classifier, check_classifier
from rlx.tasks.reward_models.judge import Judge, check_judge_up
from tests.helpers import serve_with, write_config
from tests.launch.test_preflight import assert_refused_before_start, train

QUESTIONS = ["12+7=", "3*4=", "40-9=", "5+5=", "8*8=", "1+1="]
RESPONSES = ["19", "12", "abc", "31", "", "2"]
ANSWERS = ["19", "12", "31", "10", "64", "2"]


@pytest.fixture(scope="module")
def judge_server(tiny_model_dir, tmp_path_factory):
    """The tiny model as a judge on the hf backend, tracing every request it queues."""
    work = tmp_path_factory.mktemp("judge")
    trace_dir = work / "trace"
    with serve_with(tiny_model_dir, work, "judge", {"RLX_TRACE_DIR": str(trace_dir)}, rollout={"backend": "hf"}) as (
        address,
        _,
    ):
        yield address, trace_dir


def queued(trace_dir) -> list[str]:
    """The request id of every prompt the server has queued, in order, from its trace."""
    ids = []
    for path in sorted(trace_dir.rglob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        ids += [str(r["r"]).split(".")[0] for r in records if r.get("n") == "queued"]
    return ids


def test_the_judge_scores_a_step_in_one_generate_request(judge_server):
    address, trace_dir = judge_server
    judge = Judge(
        RewardModelConfig(
            kind="judge", server=address, max_tokens=6, template="Q: {question} A: {response} (truth {answer}) score:"
        )
    )
    before = len(queued(trace_dir))
    replies = asyncio.run(judge.generate(judge.prompts(QUESTIONS, RESPONSES, ANSWERS)))
    new = queued(trace_dir)[before:]
    assert len(new) == len(QUESTIONS) and len(set(new)) == 1, new  # six prompts, one request
    scored = asyncio.run(judge.score(QUESTIONS, RESPONSES, ANSWERS))
    new = queued(trace_dir)[before + len(QUESTIONS) :]
    assert len(new) == len(QUESTIONS) and len(set(new)) == 1, new
    assert len(scored.scores) == len(QUESTIONS)
    numbers = [re.search(r"-?\d+(?:\.\d+)?", reply) for reply in replies]  # greedy: score saw the same replies
    assert scored.scores == [float(m.group(0)) if m else 0.0 for m in numbers]
    assert scored.metrics["judge_unparsed"] == sum(m is None for m in numbers)


def test_an_unparsable_judge_reply_is_reward_0_and_counted(judge_server):
    address, _ = judge_server
    judge = Judge(RewardModelConfig(kind="judge", server=address, max_tokens=4, score_pattern=r"SCORE=(\d+)"))
    scored = asyncio.run(judge.score(QUESTIONS, RESPONSES, ANSWERS))
    assert scored.scores == [0.0] * len(QUESTIONS)
    assert scored.metrics["judge_unparsed"] == len(QUESTIONS)


def test_judge_templates_and_reply_parsing():
    judge = Judge(
        RewardModelConfig(
            kind="judge", server="tcp://127.0.0.1:5555", template="{{json}} Q={question} R={response} A={answer}"
        )
    )
    assert judge.prompts(["2+2="], ["4 {x}"], ["4"]) == ["{json} Q=2+2= R=4 {x} A=4"]
    assert [judge.parse(r) for r in ("8/10", "score: -1.5 of 3", "no idea")] == [8.0, -1.5, None]
    grouped = Judge(RewardModelConfig(kind="judge", server="ipc:///x.sock", score_pattern=r"\[(\d)\]"))
    assert [grouped.parse(r) for r in ("7 [3]", "[x]")] == [3.0, None]
    yes_no = Judge(RewardModelConfig(kind="judge", server="ipc:///x.sock", parse="yes_no"))
    assert [yes_no.parse(r) for r in ("Yes.", "nope, no", "maybe")] == [1.0, 0.0, None]


def test_a_dead_judge_fails_the_step_naming_its_address(tmp_path):
    address = f"ipc://{tmp_path}/no-judge.sock"
    judge = Judge(RewardModelConfig(kind="judge", server=address, timeout_s=0.5))
    start = time.monotonic()
    with pytest.raises(RewardModelError, match=re.escape(address)):
        asyncio.run(judge.score(QUESTIONS, RESPONSES, ANSWERS))
    assert time.monotonic() - start < 30  # bounded by timeout_s, not a hang
    with pytest.raises(ConfigError, match="did not answer a health check"):
        check_judge_up(judge.rm, timeout_s=0.5)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"template": "{question} {respnse}"}, "unknown placeholder {respnse}"),
        ({"template": "{question} only"}, "has no {response}"),
        ({"server": "localhost:5555"}, "is not a rollout server address"),
        ({"server": "tcp://127.0.0.1:http"}, "is not a rollout server address"),
        ({"score_pattern": "(\\d"}, "is not a regex"),
    ],
)
def test_bad_judge_settings_are_config_errors(kwargs, fragment):
    settings = {"kind": "judge", "server": "tcp://127.0.0.1:5555", **kwargs}
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        RewardModelConfig(**settings)


def save_classifier(tiny_model_dir, out, num_labels: int = 1, vocab_size: int | None = None):
    import transformers

    config = transformers.AutoConfig.from_pretrained(tiny_model_dir, num_labels=num_labels)
    if vocab_size is not None:
        config.vocab_size = vocab_size
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def reference_scores(rm, texts: list[str]) -> list[float]:
    """One unpadded forward per text."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(rm.path)
    model = AutoModelForSequenceClassification.from_pretrained(rm.path, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            logits = model(input_ids=ids).logits[0].float()
            out.append(float(logits[0] if rm.label < 0 else logits.softmax(-1)[rm.label]))
    return out


@pytest.mark.parametrize("num_labels, label", [(1, -1), (3, 2)])
def test_classifier_batches_equal_per_sample_forwards(tiny_model_dir, tmp_path, num_labels, label):
    path = save_classifier(tiny_model_dir, tmp_path / "rm", num_labels)
    rm = RewardModelConfig(kind="classifier", path=str(path), label=label, batch_size=4)
    check_classifier(rm)
    scored = asyncio.run(Classifier(rm).score(QUESTIONS, RESPONSES, ANSWERS))
    expected = reference_scores(rm, [q + r for q, r in zip(QUESTIONS, RESPONSES, strict=True)])
    torch.testing.assert_close(torch.tensor(scored.scores), torch.tensor(expected), rtol=0, atol=1e-5)
    assert len(set(scored.scores)) > 1  # the rows differ: each read its own last token


def test_bad_classifiers_are_refused_naming_the_fix(tiny_model_dir, tmp_path):
    def refused(path, fragment, label=-1):
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            check_classifier(RewardModelConfig(kind="classifier", path=str(path), label=label))

    refused(tmp_path / "missing", "has no config.json")
    refused(tiny_model_dir, "num_labels=2")  # the policy's directory: a causal LM, default two labels
    two = save_classifier(tiny_model_dir, tmp_path / "two", num_labels=2)
    refused(two, "set a label in 0..1", label=5)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (two / name).unlink(missing_ok=True)
    refused(two, "has no tokenizer files", label=1)
    refused(save_classifier(tiny_model_dir, tmp_path / "small", vocab_size=8), "embedding only 8")
    with pytest.raises(ConfigError, match="needs task.reward_model.path"):
        RewardModelConfig(kind="classifier")


def test_train_refuses_a_missing_classifier_before_starting(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "run.yaml",
        tiny_model_dir,
        rollout={"backend": "hf"},
        trainer={"output_dir": str(run_dir)},
        task={"reward_model": {"kind": "classifier", "path": str(tmp_path / "nowhere")}},
    )
    code, output = train(config)
    assert_refused_before_start(code, output, run_dir, "task.reward_model.path=", "has no config.json")


def test_the_collector_mixes_classifier_scores_into_rewards(tiny_model_dir, judge_server, tmp_path):
    """A real step on the hf server: reward = weight * classifier score + (1 - weight) * task reward."""
    from rlx.config import load_config
    from rlx.orchestrator.collector import Collector
    from rlx.rollout.client import RolloutClient
    from rlx.tasks import Problem

    path = save_classifier(tiny_model_dir, tmp_path / "rm")
    cfg = load_config(
        write_config(
            tmp_path / "c.yaml",
            tiny_model_dir,
            rollout={"n": 2, "max_tokens": 4},
            task={"reward_model": {"kind": "classifier", "path": str(path), "weight": 0.25}},
        )
    )
    task = SimpleNamespace(reward=lambda completion, problem: 1.0, is_correct=lambda completion, problem: False)
    client = RolloutClient([judge_server[0]])
    try:
        collector = Collector(cfg, client, task)
        problems = [
            Problem(id=i, prompt=q, answer=a) for i, (q, a) in enumerate(zip(QUESTIONS[:3], ANSWERS[:3], strict=True))
        ]
        collected = asyncio.run(collector.collect(problems, seed=1))
    finally:
        client.close()
    prompts = [p.prompt for p in problems for _ in range(2)]
    scores = reference_scores(
        cfg.task.reward_model, [q + c for q, c in zip(prompts, collected.completions, strict=True)]
    )
    expected = torch.tensor([0.25 * s + 0.75 for s in scores])
    torch.testing.assert_close(torch.tensor([s.reward for s in collected.samples]), expected, rtol=0, atol=1e-5)
    assert collected.metrics["reward_model_mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)


def test_requests_of_two_clients_keep_apart_in_the_servers_trace(judge_server):
    """Each client numbers its requests from 1; the server's trace names each request its own way."""
    address, trace_dir = judge_server
    before = len(queued(trace_dir))

    async def one_request():
        client = RolloutClient([address])
        try:
            await client.generate(["1+1="], p.SamplingSpec(n=1, temperature=0.0, max_tokens=2))
        finally:
            client.close()

    asyncio.run(one_request())
    asyncio.run(one_request())
    new = queued(trace_dir)[before:]
    assert len(new) == 2 and new[0] != new[1], new
    assert all(i.startswith("rollout0:") for i in new), new  # the server's process name in the trace


def test_fully_async_mixes_classifier_scores_into_the_groups_a_step_takes(tiny_model_dir, judge_server, tmp_path):
    """trainer.mode=fully_async with a reward model: the groups a step takes are scored then, as a sync step's are."""
    from rlx.config import load_config
    from rlx.orchestrator.collector import Collector
    from rlx.orchestrator.fully_async import FullyAsyncRollout
    from rlx.tasks import DataStream, Problem

    path = save_classifier(tiny_model_dir, tmp_path / "rm")
    cfg = load_config(
        write_config(
            tmp_path / "c.yaml",
            tiny_model_dir,
            rollout={"n": 2, "max_tokens": 4},
            trainer={"mode": "fully_async", "prompts_per_step": 3, "total_steps": 1},
            task={"reward_model": {"kind": "classifier", "path": str(path), "weight": 0.5}},
        )
    )
    task = SimpleNamespace(reward=lambda completion, problem: 1.0, is_correct=lambda completion, problem: False)
    problems = [
        Problem(id=i, prompt=q, answer=a) for i, (q, a) in enumerate(zip(QUESTIONS[:3], ANSWERS[:3], strict=True))
    ]

    async def one_step():
        client = RolloutClient([judge_server[0]])
        rollout = FullyAsyncRollout(cfg, Collector(cfg, client, task), DataStream(problems, seed=0), 0)
        try:
            return await rollout.next_batch(0)
        finally:
            rollout.close()
            client.close()

    collected = asyncio.run(one_step())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tokenizer.decode(s.prompt_ids.tolist()) for s in collected.samples]
    assert sorted(prompts) == sorted(p.prompt for p in problems for _ in range(2))  # the three groups, two samples
    scores = reference_scores(
        cfg.task.reward_model, [q + c for q, c in zip(prompts, collected.completions, strict=True)]
    )
    expected = torch.tensor([0.5 * s + 0.5 for s in scores])
    torch.testing.assert_close(torch.tensor([s.reward for s in collected.samples]), expected, rtol=0, atol=1e-5)
    assert collected.metrics["reward_model_mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)
    assert collected.metrics["staleness_max"] == 0
