"""reasoning-gym tasks: the library's own generator and scorer behind rlx's Task, seeded and split, and its
export read back by the gsm8k task on a machine without the library."""

from __future__ import annotations

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.tasks import build_task

pytest.importorskip("reasoning_gym")

SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def chain_sum(**kw) -> TaskConfig:
    return TaskConfig(name="reasoning_gym", dataset="chain_sum", dataset_config=SUMS, num_train=40, num_eval=8, **kw)


def test_entries_are_the_librarys_seeded_and_split():
    import reasoning_gym

    task = build_task(chain_sum(seed=3))
    assert len(task.train) == 40 and len(task.eval) == 8
    library = reasoning_gym.create_dataset("chain_sum", size=48, seed=3, **SUMS)
    assert [p.prompt for p in task.train + task.eval] == [e["question"] for e in library]  # no chat template here
    assert [p.answer for p in task.eval] == [str(e["answer"]) for e in list(library)[40:]]
    assert build_task(chain_sum(seed=4)).train[0].prompt != task.train[0].prompt


def test_the_librarys_scorer_judges_the_completions_answer():
    task = build_task(chain_sum())
    problem = task.eval[0]
    wrong = str(int(problem.answer) + 1)
    assert task.reward(f"The sum is {problem.answer}.", problem) == 1.0 and task.is_correct(problem.answer, problem)
    assert task.reward(f"<answer>{problem.answer}</answer> (I first thought {wrong})", problem) == 1.0
    assert task.reward(f"It is {wrong}", problem) == 0.0 and not task.is_correct("no idea", problem)


def test_a_dataset_the_library_refuses_is_named():
    with pytest.raises(ConfigError, match="task.dataset='no_such_dataset'"):
        build_task(TaskConfig(name="reasoning_gym", dataset="no_such_dataset", num_train=4, num_eval=2))


def test_an_export_read_by_the_gsm8k_task_agrees_with_the_library(tmp_path):
    from rlx.tasks.reasoning_gym import export

    path = tmp_path / "sums.jsonl"
    assert export("chain_sum", str(path), 48, seed=3, config=SUMS) == 48
    exported = build_task(TaskConfig(name="gsm8k", path=str(path), num_eval=8))
    native = build_task(chain_sum(seed=3))
    for mine, theirs in zip(exported.eval, native.eval, strict=True):
        assert mine.prompt == theirs.prompt and mine.answer == theirs.answer
        for completion in (f"= {mine.answer}", f"= {int(mine.answer) + 3}"):
            assert exported.is_correct(completion, mine) == native.is_correct(completion, theirs)
