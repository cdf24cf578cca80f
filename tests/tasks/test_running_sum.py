"""running_sum: problems, grading of the total, and the shaped reward."""

from __future__ import annotations

from rlx.config.task import TaskConfig
from rlx.tasks import build_task
from rlx.tasks.running_sum import progress, worked


def test_problems_are_reproducible_disjoint_and_answered_with_their_work():
    cfg = TaskConfig(name="running_sum", num_terms=5, max_operand=9, num_eval=16, num_train=64, seed=3)
    task, again = build_task(cfg), build_task(cfg)
    assert [p.prompt for p in task.train] == [p.prompt for p in again.train]
    assert not {p.prompt for p in task.train} & {p.prompt for p in task.eval}
    for p in task.train + task.eval:
        terms = [int(t) for t in p.prompt.rstrip("=").split("+")]
        assert len(terms) == 5 and p.answer == worked(terms) and p.answer.endswith(f"#{sum(terms)}")
        assert task.is_correct(p.answer, p) and task.reward(p.answer, p) == 1.0


def test_only_the_total_is_graded_and_the_reward_counts_steps_up_to_the_first_slip():
    cfg = TaskConfig(name="running_sum", num_terms=4, max_operand=9, num_eval=4, num_train=8)
    task = build_task(cfg)
    problem = task.eval[0]
    assert task.is_correct("any work at all#" + problem.answer.rsplit("#", 1)[1] + "\nmore", problem)
    assert not task.is_correct(problem.answer.rsplit("#", 1)[0], problem)  # no total written
    answer = worked([3, 4, 5, 6])  # 3+4=7;7+5=12;12+6=18#18: three steps and the total
    assert progress(answer, answer) == 1.0
    assert progress("3+4=7;7+5=12;12+6=17#17", answer) == 0.5
    assert progress("3+4=7;7+5=13;13+6=18#18", answer) == 0.25  # later right steps do not count after a slip
    assert progress("", answer) == 0.0
