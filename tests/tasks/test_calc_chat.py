"""calc's chat prompt: task.num_examples worked examples as chat turns, then the question; no drawn problem is
one of the examples."""

from __future__ import annotations

import json

import pytest

from rlx.config.errors import ConfigError
from rlx.config.task import TaskConfig
from rlx.tasks.calc import EXAMPLES, Calc


@pytest.mark.parametrize("num_examples", [0, 1, 2])
def test_messages_hold_the_examples_asked_for_then_the_question(num_examples):
    task = Calc.from_config(TaskConfig(name="calc", max_operand=99, num_eval=8, num_examples=num_examples))
    problem = task.train[0]
    messages = task.messages(problem)
    assert len(messages) == 4 * num_examples + 1
    assert messages[-1] == {"role": "user", "content": f"What is {problem.prompt.rstrip('=')}?"}
    for k, (a, b) in enumerate(EXAMPLES[:num_examples]):
        user, call, tool, answer = messages[4 * k : 4 * k + 4]
        assert user["content"] == f"What is {a}*{b}?" and tool == {"role": "tool", "content": str(a * b)}
        body = call["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")
        assert json.loads(body) == {"name": "calc", "arguments": {"expression": f"{a}*{b}"}}
        assert answer == {"role": "assistant", "content": str(a * b)}
    examples = {f"{a}*{b}=" for a, b in EXAMPLES}
    assert not examples & {p.prompt for p in task.train + task.eval}


def test_num_examples_past_the_two_there_are_is_refused():
    with pytest.raises(ConfigError, match="task.num_examples"):
        TaskConfig(name="calc", num_examples=3)
