"""On-policy distillation: a served teacher (`rlx rollout-serve`, ScoreTokens) gives the colocated teacher's
logprobs, a teacher with another tokenizer is refused before anything starts, and a real two-step run."""

import json
import shutil

import pytest
import torch

from rlx.trainer.distill import ColocatedTeacher, ServedTeacher
from tests.helpers import serve, start_rlx, stop_group, write_config
from tests.launch.test_preflight import assert_refused_before_start, train
from tests.trainer.test_trainer_step import ragged_batch, reference_logprobs


@pytest.fixture(scope="module")
def teacher_server(tiny_model_dir, tmp_path_factory):
    """The tiny model served by the hf backend as a teacher."""
    with serve(tiny_model_dir, "hf", tmp_path_factory.mktemp("teacher")) as (address, _):
        yield address


def test_served_and_colocated_teacher_logprobs_agree(tiny_model_dir, teacher_server):
    batch = ragged_batch(rows=12)
    colocated = ColocatedTeacher(str(tiny_model_dir), torch.device("cpu"), micro_batch=5).logprobs(batch)
    served = ServedTeacher(teacher_server).logprobs(batch)
    torch.testing.assert_close(served, colocated, rtol=0, atol=1e-5)
    torch.testing.assert_close(colocated.double(), reference_logprobs(tiny_model_dir, batch), rtol=0, atol=1e-5)
    assert (colocated[batch.mask == 0] == 0).all() and (colocated[batch.mask == 1] < 0).all()


def test_a_sample_with_no_completion_tokens_is_scored_as_nothing(tiny_model_dir, teacher_server):
    """A sample can hold no completion tokens (a turn of an episode, or one from another sender): the served
    teacher sends the others and leaves its row at 0, as the colocated one does."""
    from rlx.trainer.batch import build_batch

    batch = build_batch(
        [[5, 6, 7], [8, 9], [10, 11, 12, 13]],
        [[14, 15], [], [16]],
        [[-1.0, -1.0], [], [-1.0]],
        [1.0, 0.0, 1.0],
        pad_id=0,
    )
    served = ServedTeacher(teacher_server).logprobs(batch)
    colocated = ColocatedTeacher(str(tiny_model_dir), torch.device("cpu"), micro_batch=3).logprobs(batch)
    torch.testing.assert_close(served, colocated, rtol=0, atol=1e-5)
    assert (served[1] == 0).all() and (served[batch.mask == 1] < 0).all()


def test_a_vllm_teacher_gives_the_colocated_teachers_logprobs(tiny_model_dir, vllm_server):
    """vLLM's prompt logprobs (the shared vLLM server holds the tiny model's weights in float32)."""
    batch = ragged_batch(rows=6)
    colocated = ColocatedTeacher(str(tiny_model_dir), torch.device("cpu"), micro_batch=6).logprobs(batch)
    torch.testing.assert_close(ServedTeacher(vllm_server).logprobs(batch), colocated, rtol=0, atol=1e-5)


def test_a_bad_score_request_gets_an_error_naming_the_field(teacher_server):
    import asyncio

    from rlx.rollout.client import RolloutClient, RolloutServerError
    from rlx.rollout.protocol import ScoreTokens

    async def ask():
        client = RolloutClient([teacher_server], timeout_s=10.0)
        try:
            await client.call(0, ScoreTokens(token_ids=[[5, 6, 7]], start=[0]))
        finally:
            client.close()

    with pytest.raises(RolloutServerError, match=r"start\[0\]=0 must be in \[1, 2\]"):
        asyncio.run(ask())


def test_a_teacher_with_another_tokenizer_is_refused_before_anything_starts(tiny_model_dir, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    spec = json.loads((teacher / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]  # the same size, two digits swapped
    (teacher / "tokenizer.json").write_text(json.dumps(spec))
    config = write_config(
        tmp_path / "run.yaml",
        tiny_model_dir,
        rollout={"backend": "hf"},
        trainer={"output_dir": str(tmp_path / "run")},
        algorithm={"distill": {"teacher": str(teacher)}},
    )
    code, output = train(config)
    assert_refused_before_start(code, output, tmp_path / "run", "algorithm.distill.teacher=", "another tokenizer")


def test_a_two_step_run_with_a_served_teacher(tiny_model_dir, teacher_server, tmp_path):
    """The teacher is the student's own starting point, so the first step's reverse KL is ~0. The random model
    rarely earns a reward, so an entropy bonus makes sure the first update moves the student."""
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path / "distill.yaml",
        tiny_model_dir,
        rollout={"backend": "hf", "n": 4, "max_tokens": 6},
        algorithm={
            "entropy_coef": 0.01,
            "distill": {
                "teacher": str(tiny_model_dir),
                "teacher_placement": "served",
                "teacher_server": teacher_server,
            },
        },
        trainer={"total_steps": 2, "prompts_per_step": 4, "eval_every": 0, "lr": 1e-3, "output_dir": str(run_dir)},
        checkpoint={"save_final": False},
        task={"num_eval": 8},
    )
    proc = start_rlx(["train", str(config)], tmp_path / "train.log")
    try:
        assert proc.wait(300) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        stop_group(proc)
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r.get("step", 0) >= 1]
    assert len(steps) == 2 and all("distill_reverse_kl" in r and r["teacher_logp_mean"] < 0 for r in steps)
    assert abs(steps[0]["distill_reverse_kl"]) < 1e-4
    assert abs(steps[1]["distill_reverse_kl"]) > 1e-4  # the student moved after its first update
