"""A run's Hub model ids, resolved once, in the launcher, before any process starts (``rlx.formats.hub``).

``model.path`` (pinned by ``model.revision``), ``algorithm.distill.teacher`` and ``task.reward_model.path`` (pinned
by an ``@REVISION`` suffix) may name a Hub id; each is replaced in the run's config by its snapshot directory, and
``model.revision`` by the commit, so ``RUN_DIR/config.yaml`` and every role file name one snapshot for every process
of the run and every Ray node (which then needs that snapshot at the same path: a shared HF_HOME). A ``--resume``
takes the commit its run recorded where nothing is pinned, so a branch that moved meanwhile does not change the
weights under it; a pin that resolves to another commit is refused. A path kept for a ``build_if_missing`` build is
a local directory, never an id (a note says so where it reads as one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.formats.hub import MODEL_KEYS, parse_id, resolve, snapshot_of

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig

BUILDS = {
    "model.path": "model.build_if_missing",
    "algorithm.distill.teacher": "algorithm.distill.teacher_build_if_missing",
}


def resolve_run_models(cfg: RunConfig, run_dir: Path, note: Callable[[str], None], local_only: bool = False) -> None:
    """Each Hub id of ``cfg`` replaced by its snapshot directory (``model.revision`` set to the commit); with
    ``local_only`` (`rlx doctor`) nothing is downloaded and an id the cache lacks is an error."""
    previous = _previous_config(run_dir) if cfg.trainer.resume else {}
    for key in MODEL_KEYS:
        value = _get(cfg, key)
        if not value or (key in BUILDS and _is_build_target(value, key, _get(cfg, BUILDS[key]), note)):
            continue
        revision, revision_key = (cfg.model.revision, "model.revision") if key == "model.path" else ("", "")
        parsed = parse_id(value)
        if parsed is None:
            _check_local(value, revision, key)
            continue
        repo_id = parsed[0]
        before = snapshot_of(_get(previous, key) or "")
        before = before if before is not None and before.repo_id == repo_id else None
        pinned = parsed[1] or revision
        if before is not None and not pinned:
            note(f"--resume: {key}={value} stays at commit {before.commit}, the revision the run trained from")
        revision = revision or ("" if pinned else before.commit if before else "")
        snap = resolve(value, key, revision, revision_key, local_only)
        if before is not None and snap.commit != before.commit:
            raise ConfigError(
                f"--resume: {key}={value} pins revision {pinned!r} (commit {snap.commit}), but the run in {run_dir} "
                f"trained from commit {before.commit}; set {_pin(key, repo_id, before.commit)} to continue it, or "
                "run without --resume"
            )
        _set(cfg, key, snap.path)
        if key == "model.path":
            cfg.model.revision = snap.commit
        note(f"{key}={value}: Hub snapshot {snap.path} (commit {snap.commit})")


def _is_build_target(value: str, key: str, build: str, note: Callable[[str], None]) -> bool:
    """Whether ``value`` is the local path a ``build_if_missing`` build writes (``models/teacher`` is one, though it
    reads as an id); where it also reads as a Hub id, a note says how to train the Hub model instead."""
    if build and parse_id(value) is not None:
        note(
            f"{key}={value} is taken as the local path {BUILDS[key]}={build} builds, not as a Hugging Face Hub "
            f"id; to train the Hub model, set {BUILDS[key]}=''"
        )
    return bool(build)


def _pin(key: str, repo_id: str, commit: str) -> str:
    return f"model.revision={commit}" if key == "model.path" else f"{key}={repo_id}@{commit}"


def _check_local(value: str, revision: str, key: str) -> None:
    """A revision pins a Hub id only; a local path with one is a mistake, unless it is that commit's snapshot (a
    config the launcher already resolved)."""
    if not revision:
        return
    snap = snapshot_of(value)
    if snap is None or snap.commit != revision:
        raise ConfigError(
            f"model.revision={revision!r} pins a Hub id's revision, but {key}={value!r} is a local path; set "
            f"{key} to the id (ORG/NAME), or model.revision=''"
        )


def _previous_config(run_dir: Path) -> dict:
    """The config the run being resumed recorded (RUN_DIR/config.yaml), {} if it has none."""
    import yaml

    path = run_dir / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _get(holder, key: str):
    for part in key.split("."):
        holder = holder.get(part) if isinstance(holder, dict) else getattr(holder, part, None)
        if holder is None:
            return None
    return holder


def _set(cfg: RunConfig, key: str, value: str) -> None:
    *sections, name = key.split(".")
    holder = cfg
    for part in sections:
        holder = getattr(holder, part)
    setattr(holder, name, value)
