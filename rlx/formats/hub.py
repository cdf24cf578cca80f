"""Hugging Face Hub model ids: where a model directory is taken, ``ORG/NAME`` (or ``ORG/NAME@REVISION``) names
a model of the Hub, resolved through ``huggingface_hub`` to a snapshot directory of its cache
(``HF_HOME/hub/models--ORG--NAME/snapshots/COMMIT``).

- ``parse_id``: whether a value is a Hub id at all. A path that exists, or one that starts with ``/``, ``.`` or
  ``~``, is a local directory and stays one; an id has exactly one ``/``.
- ``resolve``: the snapshot of an id at a revision (a branch, tag or commit; ``main`` when none is pinned), fetched
  by ``snapshot_download`` unless the cache already holds it. With ``HF_HUB_OFFLINE=1`` (or no network) only the
  cache is read, and an id it lacks is an error that names what the cache holds and the command that fetches it.
- ``snapshot_of``: a snapshot directory read back into its id and commit (what a run's config records).

Left out: which keys of a run hold model paths and what a resumed run pins (``rlx.launch.hub_models``), and
datasets of the Hub (``datasets`` resolves those itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rlx.config.errors import ConfigError

_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SNAPSHOT = re.compile(r"models--(?P<org>[\w.-]+?)--(?P<name>[\w.-]+)/snapshots/(?P<commit>[0-9a-f]{40})")
MODEL_KEYS = ("model.path", "algorithm.distill.teacher", "task.reward_model.path")
"""Every key of a run's config that names a model directory the run loads, and so may name a Hub id."""
IGNORED_FILES = ["*.gguf", "*.onnx", "onnx/*", "*.msgpack", "*.h5", "*.tflite", "*.ot", "original/*"]
"""Files of a model repository no rlx process loads (other frameworks' weights), left out of a download."""


@dataclass(frozen=True)
class Snapshot:
    repo_id: str
    """ORG/NAME on the Hub."""
    commit: str
    """The 40-hex commit the revision resolved to (the snapshot directory's name)."""
    path: str
    """The snapshot directory in huggingface_hub's cache, a model directory as any local one."""


def parse_id(value: str) -> tuple[str, str] | None:
    """(repo id, pinned revision or '') if ``value`` names a Hub model, None if it is a local path."""
    if not value or value.startswith(("/", ".", "~")) or Path(value).exists():
        return None
    repo_id, _, revision = value.partition("@")
    if not _ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or len(repo_id) > 96:
        return None
    return repo_id, revision


def snapshot_of(path: str) -> Snapshot | None:
    """The id and commit of a snapshot directory of huggingface_hub's cache; None for any other path."""
    match = _SNAPSHOT.search(str(path).replace("\\", "/"))
    if match is None or not str(path).rstrip("/").endswith(match.group("commit")):
        return None
    return Snapshot(f"{match.group('org')}/{match.group('name')}", match.group("commit"), str(path))


def resolve(
    value: str, key: str, revision: str = "", revision_key: str = "", local_only: bool = False
) -> Snapshot | None:
    """The snapshot ``value`` (the value of config key ``key``) names at ``revision`` (or its own ``@REVISION``;
    ``revision_key`` is the key that pins it), downloaded where the cache lacks it (never with ``local_only``);
    None for a local path."""
    parsed = parse_id(value)
    if parsed is None:
        return None
    repo_id, pinned = parsed
    if pinned and revision and pinned != revision:
        raise ConfigError(
            f"{key}={value!r} pins revision {pinned!r} and {revision_key}={revision!r} pins another; pin one"
        )
    revision = pinned or revision or "main"
    revision_key = revision_key or f"{key}'s @REVISION"
    from huggingface_hub import errors as hub
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo_id, revision=revision, ignore_patterns=IGNORED_FILES, local_files_only=local_only)
    except hub.IncompleteSnapshotError as exc:
        raise ConfigError(f"{key}={value!r}: {exc}") from None
    except (hub.RepositoryNotFoundError, hub.GatedRepoError) as exc:
        raise ConfigError(
            f"{key}={value!r}: the Hub has no model {repo_id} this machine may read ({type(exc).__name__}); check "
            f"the id, log in with `hf auth login` for a gated or private model, or set {key} to a local directory"
        ) from None
    except hub.RevisionNotFoundError:
        raise ConfigError(
            f"{key}={value!r}: {repo_id} has no revision {revision!r} on the Hub; set {revision_key} to one of "
            "its branches, tags or commits"
        ) from None
    except hub.LocalEntryNotFoundError as exc:
        raise ConfigError(not_cached(repo_id, revision, key, revision_key, exc, local_only)) from None
    return Snapshot(repo_id, Path(path).name, path)


def not_cached(
    repo_id: str, revision: str, key: str, revision_key: str, cause: Exception, local_only: bool = False
) -> str:
    """Why ``repo_id`` at ``revision`` could not be read from the cache: what the cache holds of it, and the
    command that fetches it."""
    import os

    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    refs = sorted(p for p in (storage / "refs").rglob("*") if p.is_file()) if storage.is_dir() else []
    snapshots = sorted(p.name for p in (storage / "snapshots").iterdir()) if (storage / "snapshots").is_dir() else []
    if not storage.is_dir():
        held = f"the cache ({constants.HF_HUB_CACHE}) holds nothing of {repo_id}"
    else:
        names = [f"{ref.relative_to(storage / 'refs')} -> {ref.read_text().strip()[:12]}" for ref in refs]
        held = (
            f"the cache holds {storage} without revision {revision!r} (its refs: {', '.join(names) or 'none'}; "
            f"its snapshots: {', '.join(s[:12] for s in snapshots) or 'none'})"
        )
    if local_only:
        why = "this check reads only the cache (rlx train downloads what it lacks)"
    elif constants.is_offline_mode():
        why = "HF_HUB_OFFLINE=1 reads only the cache"
    else:
        why = f"the Hub could not be reached ({str(cause).splitlines()[-1][:200]})"
    home = os.environ.get("HF_HOME", "")
    fetch = f"{f'HF_HOME={home} ' if home else ''}hf download {repo_id} --revision {revision}"
    return (
        f"{key}={repo_id!r} is not a local directory, and as a Hugging Face Hub id it is not in the cache at "
        f"revision {revision!r}: {held}; {why}. Fetch it on a machine that reaches the Hub with `{fetch}` (into the "
        f"same HF_HOME), set {revision_key} to a revision the cache holds, or set {key} to a local model directory"
    )
