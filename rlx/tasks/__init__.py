"""Tasks: datasets of prompts with ground truth, and their rewards.

``build_task(cfg.task)`` returns a ``Task`` (``base.Task``): train and eval lists of
``Problem`` plus ``reward`` and ``is_correct``. Built in: ``tiny_math`` (synthetic
arithmetic), ``running_sum`` (long worked sums), ``calc``
(two-turn multiplication with a calculator tool, ``rlx.agent``), ``gsm8k`` (math from a local
JSONL/Parquet/datasets file, ``dataset``), ``reasoning_gym`` (the library's procedural, verifiable
tasks), ``openenv`` (episodes against an OpenEnv environment server, run by ``rlx.agent.openenv``) and
``external`` (episodes an agent records on the servers' OpenAI endpoint, ``external``; its collector is
``rlx.orchestrator.external``). ``task.reward`` swaps in a
user function ``module:function`` (completion, answer) -> float. The order in which train
problems are used is ``base.DataStream``'s job; ``preflight`` checks a task's data, prompts and reward model
before a run starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rlx.tasks.base import DataStream, Problem, Task
from rlx.tasks.reward_fn import load_reward_fn

if TYPE_CHECKING:
    from rlx.config.task import TaskConfig

__all__ = ["TASKS", "DataStream", "Problem", "Task", "build_task", "load_reward_fn"]


TASKS = {
    "tiny_math": "rlx.tasks.tiny_math:TinyMath",
    "gsm8k": "rlx.tasks.gsm8k:Gsm8k",
    "running_sum": "rlx.tasks.running_sum:RunningSum",
    "calc": "rlx.tasks.calc:Calc",
    "reasoning_gym": "rlx.tasks.reasoning_gym:ReasoningGym",
    "openenv": "rlx.tasks.openenv:OpenEnvTask",
    "external": "rlx.tasks.external:External",
}
"""``task.name`` -> the task's class (imported when chosen); each is made by ``from_config``."""


def build_task(cfg: TaskConfig, tokenizer_path: str = "") -> Task:
    """The task named by ``cfg.name`` (a ``rlx.config.task.TaskConfig``), with the user reward if set;
    ``tokenizer_path`` (model.path) supplies the chat template of dataset prompts."""
    if cfg.name not in TASKS:
        raise ValueError(f"task.name={cfg.name!r} is unknown; use one of: {', '.join(TASKS)}")
    module, _, name = TASKS[cfg.name].partition(":")
    task_class = getattr(importlib.import_module(module), name)
    reward_fn = load_reward_fn(cfg.reward, "task.reward") if cfg.reward else None
    return task_class.from_config(cfg, reward_fn=reward_fn, tokenizer_path=tokenizer_path)
