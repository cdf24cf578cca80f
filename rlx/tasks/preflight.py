"""What a task needs before a run starts: its data loads, every train and eval prompt fits the rollout context
with room for a completion (counted as the rollout backend counts it; of a streamed train split, its first rows),
and its learned reward, if any, is there.
Checked in pre-flight (``rlx.launch.preflight``), which then hands the built task to the checks after it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlx.config.rollout import RolloutConfig
    from rlx.config.task import TaskConfig
    from rlx.tasks.base import Task

TOKENS_PER_BYTE_BOUND = 4
"""No tokenizer makes more tokens of a text than this many per UTF-8 byte (byte-level BPE and byte fallback make
at most one; a normalizer that decomposes characters, as NFKD does Hangul, at most three)."""
SPECIAL_TOKENS_BOUND = 16
"""Nor adds more special tokens (BOS, EOS, ...) than this to one text."""


def check_task(task_cfg: TaskConfig, model_path: str, rollout: RolloutConfig) -> Task:
    """The task built from ``task_cfg`` for the model at ``model_path``, its prompts and reward model checked."""
    from rlx.tasks import build_task
    from rlx.tasks.reward_models import check_reward_model

    task = build_task(task_cfg, model_path)
    check_prompts(task, model_path, rollout)
    check_reward_model(task_cfg.reward_model, rollout.auth_token)
    return task


def check_prompts(task: Task, model_path: str, rollout: RolloutConfig) -> None:
    """Every train and eval prompt fits rollout.max_model_len with room for a completion, counted as the
    rollout backend counts a text prompt (vLLM adds the tokenizer's special tokens, such as BOS; hf does not).
    Where every prompt is short enough that even the bound on its token count fits, nothing is counted: the
    tokenizer (transformers' import takes seconds of the run's start, before its servers start) is not loaded."""
    from rlx.tasks.base import PROMPTS_PER_CALL, check_prompt_lengths

    # task.streaming: the train split is read when drawn; its first rows are checked here, every eval row
    train = task.train if isinstance(task.train, list) else task.train[:PROMPTS_PER_CALL]
    problems = list(train) + list(task.eval)
    limit = rollout.max_model_len
    if all(TOKENS_PER_BYTE_BOUND * len(p.prompt.encode()) + SPECIAL_TOKENS_BOUND < limit for p in problems):
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    special = rollout.backend == "vllm"

    def count_tokens(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]

    check_prompt_lengths(problems, count_tokens, limit)
