"""tiny_math: enumeration, the seeded split and the exact-answer reward."""

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.tasks import build_task


def test_enumerates_every_problem_with_exact_answers():
    task = build_task(TaskConfig(max_operand=2, operators="+-*", num_eval=0))
    assert len(task.train) == 3 * 3 * 3 and task.eval == []
    by_prompt = {p.prompt: p.answer for p in task.train}
    assert by_prompt["2+1="] == "3"
    assert by_prompt["0-2="] == "-2"
    assert by_prompt["2*2="] == "4"
    assert "1/2=" not in by_prompt
    assert len({p.id for p in task.train}) == 27


def test_prompt_is_exactly_the_expression():
    task = build_task(TaskConfig(max_operand=12, operators="+", num_eval=0))
    problem = next(p for p in task.train if p.prompt == "12+7=")
    assert problem.answer == "19"


def test_split_is_seeded_disjoint_and_reproducible():
    cfg = TaskConfig(max_operand=10, num_eval=20, seed=1)
    a, b = build_task(cfg), build_task(cfg)
    assert [p.id for p in a.eval] == [p.id for p in b.eval]
    assert len(a.eval) == 20 and len(a.train) == 2 * 11 * 11 - 20
    assert not {p.id for p in a.eval} & {p.id for p in a.train}
    other = build_task(TaskConfig(max_operand=10, num_eval=20, seed=2))
    assert [p.id for p in other.eval] != [p.id for p in a.eval]


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("19", 1.0),
        (" 19 ", 1.0),
        ("19\n3+4=7", 1.0),
        ("\n19\n", 1.0),
        ("190", 0.0),
        ("19 apples", 0.0),
        ("", 0.0),
        ("-19", 0.0),
    ],
)
def test_reward_is_one_for_the_exact_answer(completion, reward):
    task = build_task(TaskConfig(max_operand=12, operators="+", num_eval=0))
    problem = next(p for p in task.train if p.prompt == "12+7=")
    assert task.reward(completion, problem) == reward
    assert task.is_correct(completion, problem) is (reward == 1.0)


def test_too_many_eval_problems_is_an_error():
    with pytest.raises(ConfigError, match="task.num_eval=9"):
        build_task(TaskConfig(max_operand=1, operators="+", num_eval=9))
