"""Held-out (or benchmark) evaluation of the policy the rollout servers hold: the one function behind both the
periodic evaluation of `rlx train` (``Collector.evaluate``) and `rlx eval`, so the two cannot disagree.

``evaluate_prompts`` sends the prompts as the task made them (the chat template, system prompt and formatting
training used) and scores each completion with the task's own ``is_correct``:

- ``accuracy``: one completion per prompt, greedy (or at ``trainer.eval_temperature``, each prompt its own fixed
  seed): what `rlx train` logs as ``eval_accuracy``;
- with ``k`` > 1 (``task.eval_k``), ``k`` samples per prompt at the rollout temperature (``trainer.eval_temperature``
  when > 0), seeded per prompt the same at every evaluation: ``pass@1`` (the mean over the samples), ``pass@k``
  (any of the ``k`` correct) and ``maj@k`` (the most common answer is correct; answers are the task's
  ``answer_of`` where it has one, else the stripped completion; a tie goes to the answer drawn first).

``resolve_model`` turns `rlx eval --model` into a Hugging Face directory the engine loads: a directory as it is, a
Hub id (``ORG/NAME[@REVISION]``) as its snapshot in huggingface_hub's cache (``rlx.formats.hub``), or a run (its
``checkpoints/`` or one ``step_*`` directory) as its newest complete checkpoint, converted once into
``RUN_DIR/eval/``. Starting servers and writing the report are the launcher's (``rlx.launch.evaluation``).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from rlx.config.errors import ConfigError
from rlx.rollout.protocol import SamplingSpec
from rlx.trace import tracer

if TYPE_CHECKING:
    from rlx.config.rollout import SamplingConfig
    from rlx.rollout.client import RolloutClient
    from rlx.tasks import Problem, Task

EVAL_SEED = 7919
"""Seeds of sampled held-out evaluation, apart from every step's (``rlx.orchestrator.episodes`` uses the same)."""
SEED_STRIDE = 100_003
"""Seeds of two held-out prompts lie this far apart (times the samples each draws: the engine seeds a request's
samples seed, seed + 1, ...)."""


async def evaluate_prompts(
    client: RolloutClient,
    task: Task,
    problems: list[Problem],
    sampling: SamplingConfig,
    eval_temperature: float = 0.0,
    k: int = 1,
    timeout_s: float | None = None,
) -> dict[str, float]:
    """``accuracy`` on ``problems``, and with ``k`` > 1 ``pass@1``, ``pass@k`` and ``maj@k`` (module docstring);
    NaN for each when there are no problems."""
    names = ["accuracy"] + (["pass@1", f"pass@{k}", f"maj@{k}"] if k > 1 else [])
    if not problems:
        return dict.fromkeys(names, math.nan)
    with tracer.span("eval", prompts=len(problems), k=k):
        spec = SamplingSpec.of(sampling, n=1, temperature=eval_temperature)
        first = await _generate(client, problems, spec, timeout_s, seeded=eval_temperature > 0.0)
        metrics = {"accuracy": statistics.fmean(task.is_correct(r[0], p) for p, r in zip(problems, first, strict=True))}
        if k > 1:
            spec = SamplingSpec.of(sampling, n=k, temperature=eval_temperature or sampling.temperature)
            drawn = await _generate(client, problems, spec, timeout_s, seeded=True)
            metrics.update(sampled_metrics(task, problems, drawn, k))
    return metrics


async def _generate(client, problems, spec: SamplingSpec, timeout_s, seeded: bool) -> list[list[str]]:
    """The completions of each problem: one request for all when unseeded (greedy), else one per problem with
    its own seed, the same at every evaluation."""
    if not seeded:
        results = await client.generate([p.prompt for p in problems], spec, timeout_s=timeout_s)
    else:
        specs = [
            msgspec.structs.replace(spec, seed=(EVAL_SEED * SEED_STRIDE + i) * spec.n) for i in range(len(problems))
        ]
        from rlx.orchestrator.collector import gather_or_cancel

        requests = (client.generate([p.prompt], s, timeout_s=timeout_s) for p, s in zip(problems, specs, strict=True))
        results = await gather_or_cancel(requests)
        results = [r[0] for r in results]
    return [[sample.text for sample in result.samples] for result in results]


def sampled_metrics(task: Task, problems: list[Problem], completions: list[list[str]], k: int) -> dict[str, float]:
    """pass@1, pass@k and maj@k of ``k`` completions per problem, judged by ``task.is_correct``."""
    answer_of = getattr(task, "answer_of", None) or (lambda text: text.strip())
    pass1, passk, majk = [], [], []
    for problem, texts in zip(problems, completions, strict=True):
        correct = [bool(task.is_correct(text, problem)) for text in texts]
        pass1.append(statistics.fmean(correct))
        passk.append(any(correct))
        answers = [answer_of(text) for text in texts]
        votes = Counter(a for a in answers if a is not None)
        if votes:
            top = max(votes.values())
            winner = next(a for a in answers if a is not None and votes[a] == top)  # a tie: the first drawn
            majk.append(correct[answers.index(winner)])
        else:
            majk.append(False)
    return {"pass@1": statistics.fmean(pass1), f"pass@{k}": statistics.fmean(passk), f"maj@{k}": statistics.fmean(majk)}


@dataclass
class ModelSource:
    """What `rlx eval --model` names, as the engine loads it."""

    given: str
    """--model as given."""
    path: Path
    """The Hugging Face directory served."""
    kind: str
    """hf (a model directory) or run (a trainer checkpoint of a run, converted)."""
    step: int | None = None
    """The checkpoint's step (kind run)."""
    revision: str = ""
    """A Hub snapshot's commit (a Hub id, or a directory inside huggingface_hub's cache), else empty."""
    digest: str = ""
    """sha256 over the weights: of the checkpoint's manifest (which holds every file's sha256) for a run, else of
    the directory's safetensors files in name order."""
    notes: list[str] = field(default_factory=list)
    """Checkpoints passed over (corrupt or partial) on the way to the newest complete one."""
    run_dir: Path | None = None
    """The run the checkpoint is of (kind run)."""

    def as_dict(self) -> dict:
        return {
            "given": self.given,
            "path": str(self.path),
            "kind": self.kind,
            "step": self.step,
            "revision": self.revision,
            "sha256": self.digest,
        }


def resolve_model(given: str) -> ModelSource:
    """--model as a Hugging Face directory (module docstring); a LoRA run's checkpoint (an adapter only) is refused."""
    from rlx.convert.convert_ckpt import detect_source
    from rlx.convert.errors import ConvertError
    from rlx.formats.hub import parse_id, resolve, snapshot_of

    if parse_id(given) is not None:  # ORG/NAME[@REVISION]: its snapshot in huggingface_hub's cache
        snapshot = resolve(given, "--model")
        path = Path(snapshot.path)
        return ModelSource(given, path, "hf", revision=snapshot.commit, digest=_weights_digest(path))
    path = Path(given).expanduser().resolve()
    if not path.exists():
        raise ConfigError(
            f"--model {given}: no such directory; pass a Hugging Face model directory, a Hub id (ORG/NAME) or a run "
            "directory (trainer.output_dir, its checkpoints/ or one step_* directory)"
        )
    try:
        kind = detect_source(path)
    except ConvertError as exc:
        raise ConfigError(f"--model {given}: {exc}") from None
    if kind == "hf":
        snapshot = snapshot_of(str(path))
        revision = snapshot.commit if snapshot is not None else ""
        return ModelSource(given, path, "hf", revision=revision, digest=_weights_digest(path))
    if kind != "trainer":
        raise ConfigError(
            f"--model {given} is a {kind} checkpoint; convert it to a Hugging Face directory first "
            f"(rlx convert-ckpt {given} DIR), then pass --model DIR"
        )
    return _converted(given, path)


def _converted(given: str, path: Path) -> ModelSource:
    """The run's newest complete checkpoint as a Hugging Face directory under RUN_DIR/eval/ (written once)."""
    from rlx.convert.convert_ckpt import ConvertOptions, build_job
    from rlx.convert.errors import ConvertError
    from rlx.convert.trainer_ckpt import resolve_trainer_checkpoint
    from rlx.formats.checkpoint import MANIFEST

    try:
        ckpt = resolve_trainer_checkpoint(path)
        digest = hashlib.sha256((ckpt.path / MANIFEST).read_bytes()).hexdigest()
        run_dir = ckpt.path.parent.parent if ckpt.path.parent.name == "checkpoints" else ckpt.path.parent
        target = run_dir / "eval" / f"{ckpt.path.name}-hf"
        if not (target / "config.json").is_file() or _stamp(target) != digest:
            job = build_job(ckpt.path, ConvertOptions(to="hf"))
            target.parent.mkdir(parents=True, exist_ok=True)
            _run_quietly(job, target)
            (target / STAMP).write_text(digest + "\n")
    except ConvertError as exc:
        raise ConfigError(f"--model {given}: {exc}") from None
    return ModelSource(given, target, "run", ckpt.step, digest=digest, notes=list(ckpt.skipped), run_dir=run_dir)


STAMP = "rlx_checkpoint_sha256.txt"
"""In a converted directory: the sha256 of the manifest of the checkpoint it was converted from."""


def logged_evaluation(source: ModelSource) -> dict[str, float]:
    """What the run logged at the checkpoint's step for its held-out evaluation (eval_* of metrics.jsonl), if it
    evaluated there; empty otherwise."""
    import json

    path = source.run_dir / "metrics.jsonl" if source.run_dir is not None else None
    if path is None or not path.is_file():
        return {}
    for line in reversed(path.read_text().splitlines()):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("step") == source.step:
            return {k: v for k, v in row.items() if k.startswith("eval_")}
    return {}


def _stamp(target: Path) -> str:
    stamp = target / STAMP
    return stamp.read_text().strip() if stamp.is_file() else ""


def _run_quietly(job, target: Path) -> None:
    import shutil

    from rich.console import Console

    if target.exists():  # converted from an older checkpoint of the run
        shutil.rmtree(target)
    job.run(target, Console(quiet=True))


def _weights_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()
