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
problems are used is ``base.DataStream``'s job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlx.tasks.base import DataStream, Problem, Task
from rlx.tasks.reward_fn import load_reward_fn

if TYPE_CHECKING:
    from rlx.config.schema import TaskConfig

__all__ = ["DataStream", "Problem", "Task", "build_task", "load_reward_fn"]


def build_task(cfg: TaskConfig, tokenizer_path: str = "") -> Task:
    """The task named by ``cfg.name`` (a ``rlx.config.schema.TaskConfig``), with the user reward if set;
    ``tokenizer_path`` (model.path) supplies the chat template of dataset prompts."""
    reward_fn = load_reward_fn(cfg.reward, "task.reward") if cfg.reward else None
    if cfg.name == "tiny_math":
        from rlx.tasks.tiny_math import TinyMath

        return TinyMath.from_config(cfg, reward_fn)
    if cfg.name == "gsm8k":
        from rlx.tasks.gsm8k import Gsm8k

        return Gsm8k.from_config(cfg, reward_fn, tokenizer_path)
    if cfg.name == "running_sum":
        from rlx.tasks.running_sum import RunningSum

        return RunningSum.from_config(cfg, reward_fn)
    if cfg.name == "calc":
        from rlx.tasks.calc import Calc

        return Calc.from_config(cfg, reward_fn)
    if cfg.name == "reasoning_gym":
        from rlx.tasks.reasoning_gym import ReasoningGym

        return ReasoningGym.from_config(cfg, reward_fn, tokenizer_path)
    if cfg.name == "openenv":
        from rlx.tasks.openenv import OpenEnvTask

        return OpenEnvTask.from_config(cfg)
    if cfg.name == "external":
        from rlx.tasks.external import External

        return External()
    raise ValueError(
        f"task.name={cfg.name!r} is unknown; use tiny_math, gsm8k, running_sum, calc, reasoning_gym, "
        "openenv or external"
    )
