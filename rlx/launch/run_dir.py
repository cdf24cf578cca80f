"""The run directory of `rlx train`: an earlier run's outputs moved aside, the config children
read, the launcher's own log, and the socket files removed at the end.

``RUN_DIR/config.yaml`` is the resolved config with every secret redacted (``rlx.config.redact``):
it is for people to read and for children to load. A child that needs a secret gets it through
its environment: ``secret_overrides`` gives the ``key=${oc.env:VAR}`` overrides to append to its
argv (the value never appears in argv, a file or a log) and the environment that carries the values.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.redact import SECRET_ENV
from rlx.launch.display import Display
from rlx.net import ipc_path

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig

PLOTS_DIR = "plots"
"""Where `rlx plot` writes a run's images by default: inside the run's outputs, so they move aside with them."""
# What a run writes into its directory (``trace`` only when trace.dir is not set elsewhere), and `rlx plot`.
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "checkpoints", "logs", "trace", "tb", "wandb", "hf", PLOTS_DIR)


def archive_previous_run(run_dir: Path, display: Display) -> Path | None:
    """Move an earlier run's outputs out of ``run_dir`` into a sibling ``<name>.<time>`` directory.

    A fresh run on top of them would append to their metrics, mix its trace files with theirs, and
    let their higher-numbered checkpoints prune its own; moving them loses nothing. Files rlx did
    not write stay where they are.
    """
    found = [run_dir / name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    archive = run_dir.with_name(f"{run_dir.name}.{stamp}")
    suffix = 1
    while archive.exists():
        suffix += 1
        archive = run_dir.with_name(f"{run_dir.name}.{stamp}-{suffix}")
    archive.mkdir()
    for path in found:
        path.rename(archive / path.name)
    display.note(
        f"{run_dir} held an earlier run: moved its outputs to {archive} (pass --resume to continue a run instead)"
    )
    return archive


def write_config(cfg: RunConfig, run_dir: Path) -> Path:
    """RUN_DIR/config.yaml: the resolved config, secrets redacted."""
    import yaml

    from rlx.config.redact import redacted

    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(redacted(cfg), sort_keys=False))
    return path


def secret_overrides(cfg: RunConfig) -> tuple[list[str], dict[str, str]]:
    """Overrides that give a child loading config.yaml the secrets it redacts, and the env they read."""
    overrides, env = [], {}
    for key, var in SECRET_ENV.items():
        section, field = key.split(".")
        value = getattr(getattr(cfg, section), field)
        if value:
            overrides.append(f"{key}=${{oc.env:{var}}}")
            env[var] = value
    return overrides, env


def remove_sockets(addresses: list[str]) -> None:
    """Remove the socket files of the ``ipc://`` addresses the run's own servers bound."""
    for path in filter(None, map(ipc_path, addresses)):
        path.unlink(missing_ok=True)
