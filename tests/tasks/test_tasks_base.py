"""DataStream order and resumption, and loading a user reward function."""

import json
import textwrap

import pytest

from rlx.config.task import TaskConfig
from rlx.tasks import DataStream, Problem, build_task, load_reward_fn

PROBLEMS = [Problem(id=i, prompt=f"p{i}", answer=str(i)) for i in range(5)]


def ids(batch):
    return [p.id for p in batch]


def test_stream_visits_every_problem_once_per_epoch_then_reshuffles():
    stream = DataStream(PROBLEMS, seed=0)
    first, second = ids(stream.next_batch(5)), ids(stream.next_batch(5))
    assert sorted(first) == sorted(second) == [0, 1, 2, 3, 4]
    assert stream.state()["epoch"] == 1
    orders = {tuple(ids(DataStream(PROBLEMS, seed=s).next_batch(5))) for s in range(6)}
    assert len(orders) > 1  # the seed changes the order


def test_stream_batches_cross_epoch_boundaries_and_may_exceed_the_dataset():
    stream = DataStream(PROBLEMS, seed=3)
    epoch0 = ids(stream.next_batch(3)) + ids(stream.next_batch(2))
    reference = DataStream(PROBLEMS, seed=3)
    assert ids(reference.next_batch(12))[:5] == epoch0
    assert reference.state() == {"seed": 3, "epoch": 2, "index": 2, "num_problems": 5}


def test_same_seed_gives_same_batches():
    a, b = DataStream(PROBLEMS, seed=11), DataStream(PROBLEMS, seed=11)
    assert [ids(a.next_batch(3)) for _ in range(4)] == [ids(b.next_batch(3)) for _ in range(4)]


def test_state_round_trips_through_json_and_resumes_the_same_batches():
    stream = DataStream(PROBLEMS, seed=5)
    stream.next_batch(7)
    saved = json.loads(json.dumps(stream.state()))
    expected = [ids(stream.next_batch(3)) for _ in range(3)]
    resumed = DataStream(PROBLEMS, seed=5)
    resumed.load_state(saved)
    assert [ids(resumed.next_batch(3)) for _ in range(3)] == expected


def test_state_from_another_seed_or_dataset_is_refused():
    saved = DataStream(PROBLEMS, seed=5).state()
    with pytest.raises(ValueError, match="seed=5"):
        DataStream(PROBLEMS, seed=6).load_state(saved)
    with pytest.raises(ValueError, match="same task config"):
        DataStream(PROBLEMS[:4], seed=5).load_state(saved)


def test_stream_bad_input():
    with pytest.raises(ValueError, match="no training problems"):
        DataStream([], seed=0)
    with pytest.raises(ValueError, match="k=0"):
        DataStream(PROBLEMS, seed=0).next_batch(0)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        def length_bonus(completion, answer):
            return 0.5 + (completion.strip() == answer)

        def not_a_number(completion, answer):
            return "yes"

        def not_finite(completion, answer):
            return float("nan")

        NOT_CALLABLE = 3
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_user_reward_replaces_the_task_reward(user_module):
    task = build_task(TaskConfig(reward=f"{user_module}:length_bonus", num_eval=4, max_operand=3))
    problem = task.train[0]
    assert task.reward(problem.answer, problem) == 1.5
    assert task.reward("wrong", problem) == 0.5
    assert task.is_correct(problem.answer, problem)  # accuracy stays the task's own check


def test_user_reward_must_return_a_number(user_module):
    for function in ("not_a_number", "not_finite"):  # nan used to fail later, inside the advantage's statistics
        task = build_task(TaskConfig(reward=f"{user_module}:{function}", num_eval=4, max_operand=3))
        with pytest.raises(ValueError, match=f"{function} .*must return a finite float"):
            task.reward("1", task.train[0])


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no_such_module_xyz:score", r"cannot import module 'no_such_module_xyz'.*task.reward|task.reward.*no_such"),
        ("my_rewards:missing", "module 'my_rewards' has no function 'missing'"),
        ("my_rewards:NOT_CALLABLE", "not a function"),
        ("my_rewards", "must be 'module:function'"),
    ],
)
def test_reward_spec_errors_name_module_function_and_key(user_module, spec, match):
    with pytest.raises(ValueError, match=match) as info:
        load_reward_fn(spec, "task.reward")
    assert "task.reward" in str(info.value)


def test_reward_spec_error_uses_the_given_config_key(user_module):
    with pytest.raises(ValueError, match="eval.reward='nope_mod_xyz:f'"):
        load_reward_fn("nope_mod_xyz:f", "eval.reward")


def test_a_reward_module_that_exits_while_imported_is_named(tmp_path, monkeypatch):
    (tmp_path / "exiting_reward_mod.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ValueError, match=r"importing 'exiting_reward_mod' failed at .*exiting_reward_mod.py:2: SystemExit"
    ):
        load_reward_fn("exiting_reward_mod:score", "task.reward")
