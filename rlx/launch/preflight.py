"""Checks that run before any process of `rlx train` starts: the run directory, model directory
(built first when ``model.build_if_missing`` asks for it), task data (every prompt fits the context) and
reward function, the checkpoint plugins (installed under the names the config gives, importable, made without
an error), the checkpoint ``--resume`` continues from, stale weight-sync buffers. A mistake found here is one
line naming the fix; nothing has been started and nothing in the run directory was written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from rlx.config.errors import ConfigError
from rlx.launch.build_target import check_build_target
from rlx.launch.display import Display
from rlx.sync.transports.shm import remove_stale_segments

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig


def preflight(cfg: RunConfig, display: Display) -> int | None:
    """Fail before any process starts: run directory, plugins, model directory, task data, reward function,
    resume. Returns the step ``--resume`` continues from (None without --resume or a checkpoint)."""
    from rlx import placement
    from rlx.agent.tools import check_agent
    from rlx.config.roles import rollout_role, trainer_role
    from rlx.plugins import check_loadable
    from rlx.tasks import build_task
    from rlx.tasks.reward_models import check_reward_model
    from rlx.trainer.model import check_model_dir

    run_dir = Path(cfg.trainer.output_dir).resolve()
    servers, ranks = rollout_role(cfg), trainer_role(cfg)
    placement.check(servers, cfg.trainer, placement.visible_gpus())
    placement.plan(servers, cfg.trainer, placement.visible_gpus())  # the weight transport this host's layout allows
    check_output_dir(run_dir)
    check_loadable(cfg.checkpoint.plugins)
    if cfg.model.build_if_missing and not Path(cfg.model.path, "config.json").is_file():
        check_build_target(cfg.model.path, "model.path", "model.build_if_missing", cfg.model.build_if_missing, display)
        build_model(cfg, display)
    check_model_dir(cfg.model.path)
    if cfg.placement.offload is None:  # every process of the run reads the value the launcher settles here
        gpu = placement.gpu_bytes(cfg.trainer, cfg.placement)
        cfg.placement.offload, why = placement.resolve_offload(ranks, servers, gpu)
        if cfg.placement.mode == "colocated":
            display.log(f"placement: {why}")
    check_tensor_parallel(cfg)
    distill = cfg.algorithm.distill
    if distill.teacher:
        from rlx.trainer.distill import check_same_tokenizer

        if distill.teacher_build_if_missing and not Path(distill.teacher, "config.json").is_file():
            build, key = distill.teacher_build_if_missing, "algorithm.distill.teacher_build_if_missing"
            check_build_target(distill.teacher, "algorithm.distill.teacher", key, build, display)
            build_warmstart_model(distill.teacher_build_if_missing, distill.teacher, cfg, display, "the teacher")
        check_same_tokenizer(cfg.model.path, distill.teacher)
    if cfg.task.name == "external":
        from rlx.orchestrator.external import check_config

        check_config(cfg)
    task = build_task(cfg.task, cfg.model.path)
    check_prompts(cfg, task)
    check_agent(cfg.agent, cfg.task.reward, task)
    check_reward_model(cfg.task.reward_model, cfg.rollout.auth_token)
    resumed_step = check_resume(cfg, run_dir, len(task.train), display) if cfg.trainer.resume else None
    for path in remove_stale_segments():
        display.note(f"removed {path}, the weight-sync buffer of an rlx run that was killed")
    check_store(cfg, display)
    return resumed_step


def check_tensor_parallel(cfg: RunConfig) -> None:
    """rollout.tensor_parallel_size splits the model's attention heads evenly (vLLM's rule), else one error
    naming the head count and the sizes that would: before a server starts and fails inside vLLM."""
    import json

    tp = cfg.rollout.tensor_parallel_size
    if tp <= 1 or cfg.rollout.backend != "vllm":
        return
    model = json.loads(Path(cfg.model.path, "config.json").read_text())
    heads = model.get("num_attention_heads") or model.get("text_config", {}).get("num_attention_heads")
    if not heads or heads % tp == 0:
        return
    fits = [n for n in range(1, heads + 1) if heads % n == 0 and n <= 8]
    raise ConfigError(
        f"rollout.tensor_parallel_size={tp} does not divide the {heads} attention heads of model.path="
        f"{cfg.model.path!r}; use a size that does ({', '.join(map(str, fits))}), or serve more engines "
        "instead (rollout.num_servers: data parallelism)"
    )


TOKENS_PER_BYTE_BOUND = 4
"""No tokenizer makes more tokens of a text than this many per UTF-8 byte (byte-level BPE and byte fallback make
at most one; a normalizer that decomposes characters, as NFKD does Hangul, at most three)."""
SPECIAL_TOKENS_BOUND = 16
"""Nor adds more special tokens (BOS, EOS, ...) than this to one text."""


def check_prompts(cfg: RunConfig, task) -> None:
    """Every train and eval prompt fits rollout.max_model_len with room for a completion, counted as the
    rollout backend counts a text prompt (vLLM adds the tokenizer's special tokens, such as BOS; hf does not).
    Where every prompt is short enough that even the bound on its token count fits, nothing is counted: the
    tokenizer (transformers' import takes seconds of the run's start, before its servers start) is not loaded."""
    from rlx.tasks.base import check_prompt_lengths

    problems = list(task.train) + list(task.eval)
    limit = cfg.rollout.max_model_len
    if all(TOKENS_PER_BYTE_BOUND * len(p.prompt.encode()) + SPECIAL_TOKENS_BOUND < limit for p in problems):
        return
    from rlx.trainer.model import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.path)
    special = cfg.rollout.backend == "vllm"

    def count_tokens(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]

    check_prompt_lengths(problems, count_tokens, limit)


def check_store(cfg: RunConfig, display: Display) -> None:
    """The dump ``rollout.reuse`` reads (``rlx.store.dump.check_dump``); sample stores of killed runs."""
    from rlx.store.dump import check_dump
    from rlx.store.shm import remove_stale_segments as remove_stale_stores

    for path in remove_stale_stores():
        display.note(f"removed {path}, the sample store of an rlx run that was killed")
    if cfg.rollout.reuse:
        check_dump(cfg.model.path, cfg.rollout, cfg.trainer.total_steps)


def build_model(cfg: RunConfig, display: Display) -> None:
    from rlx.convert.gguf_import import PACKAGED, import_packaged

    packaged = PACKAGED.get(cfg.model.build_if_missing)
    if packaged is not None:
        files = packaged.files()
        if files is None:
            raise ConfigError(
                f"model.build_if_missing={cfg.model.build_if_missing} imports {packaged.model} from the GGUF file "
                f"PyPI packages ship, which are not installed: {packaged.install}"
            )
        source = files[0] if len(files) == 1 else f"{len(files)} parts of {files[0].parent.parent.parent}"
        display.note(f"importing {packaged.model} from {source} into {Path(cfg.model.path).resolve()} (first run only)")
        import_packaged(packaged, cfg.model.path)
        return
    if cfg.model.build_if_missing == "qwen2_0p5b_random":
        from rlx.trainer.tiny import build_qwen2_0p5b_random

        display.note(f"building a random Qwen2-0.5B-shaped model into {Path(cfg.model.path).resolve()}")
        build_qwen2_0p5b_random(cfg.model.path, seed=cfg.trainer.seed)
        return
    build_warmstart_model(cfg.model.build_if_missing, cfg.model.path, cfg, display, "the warm-started tiny model")


def build_warmstart_model(recipe: str, path: str, cfg: RunConfig, display: Display, what: str) -> None:
    """``rlx.trainer.warmstart``'s ``recipe`` on the run's task into ``path``, with a progress bar; the note names
    the absolute path, since a relative one is taken from the directory `rlx train` runs in."""
    from rich.progress import Progress

    from rlx.trainer.warmstart import build_warmstart

    display.note(
        f"building {what} into {Path(path).resolve()} (first run only; a relative path is taken from "
        "the current directory)"
    )
    with Progress(console=display.console, transient=True) as progress:
        task = progress.add_task("warm start", total=1)
        build_warmstart(
            recipe,
            path,
            cfg.task,
            seed=cfg.trainer.seed,
            progress=lambda s, n, loss: progress.update(task, completed=s, total=n),
        )


def check_output_dir(run_dir: Path) -> None:
    """``trainer.output_dir`` is a directory, or can be created as one, and is writable."""
    too_long = [part for part in run_dir.parts if len(os.fsencode(part)) > 255]
    if too_long:
        raise ConfigError(
            f"trainer.output_dir has a name of {len(os.fsencode(too_long[0]))} bytes "
            f"({too_long[0][:40]}...); file systems allow 255; set trainer.output_dir to a shorter path"
        )
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == run_dir else f"lies under {existing}, which is a file"
        raise ConfigError(f"trainer.output_dir={str(run_dir)!r} {what}; set trainer.output_dir to a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"trainer.output_dir={str(run_dir)!r}: {existing} is not writable; set "
            "trainer.output_dir to a directory you can write"
        )


def check_resume(cfg: RunConfig, run_dir: Path, num_problems: int, display: Display) -> int | None:
    """The checkpoint --resume continues from exists and fits this config; else refuse, changing nothing.
    Returns its step (None: no earlier run, start at step 0)."""
    from rlx.trainer.checkpoint import check_resumable, resume_checkpoint

    ckpt, skipped = resume_checkpoint(run_dir)
    for reason in skipped:
        display.note(f"skipping checkpoint: {escape(reason)}")
    if ckpt is None:
        return None
    check_resumable(ckpt, cfg.model.path, cfg.task.seed, num_problems, lora=bool(cfg.model.lora.rank))
    return int(ckpt.name.split("_")[-1])
