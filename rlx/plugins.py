"""Checkpoint plugins: code of installed packages that runs at checkpoint save, load and after each step.

A plugin is registered only by an installed distribution's entry point in the ``rlx.plugins``
group (``[project.entry-points."rlx.plugins"] name = "package.module:Plugin"``) and runs only
when the config names it (``checkpoint.plugins: [name]``); a config never names a module to
import. The entry point's object is called with no arguments to make the plugin, which may
define any of:

    on_save(ckpt_dir: Path, step: int)      the staged checkpoint directory, every rlx file written,
                                            before the manifest and the rename: files it adds there
                                            are hashed into the manifest
    on_load(ckpt_dir: Path, step: int)      after ``--resume`` restored the checkpoint
    after_step(step: int, metrics: dict)    after each step's metrics are logged

Hooks run on the controller (trainer rank 0), in the order the config lists the plugins. A hook
that raises ends the run with ``PluginError`` naming the plugin and the hook; a failed save hook
leaves no new checkpoint (the staged directory is removed), so the newest complete one is the
previous checkpoint. Left out: plugins on other ranks or in the rollout servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP = "rlx.plugins"
HOOKS = ("on_save", "on_load", "after_step")


class PluginError(RuntimeError):
    """A checkpoint plugin's hook raised; the message names the plugin, the hook and the error."""


def installed() -> dict[str, Any]:
    """Entry points of the ``rlx.plugins`` group, by name."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=GROUP)}


def check_installed(names: list[str]) -> None:
    """Every name in ``checkpoint.plugins`` is an installed plugin; else one error listing the installed ones."""
    from rlx.config.errors import ConfigError

    available = installed()
    missing = [name for name in names if name not in available]
    if missing:
        listed = ", ".join(sorted(available)) or "none"
        raise ConfigError(f"checkpoint.plugins names {missing[0]!r}, which is not an installed rlx plugin "
                          f"(installed: {listed}); install the package that provides it (entry-point group "
                          f"{GROUP!r}) or remove it from checkpoint.plugins")


@dataclass
class Plugins:
    """The configured plugins, made, in config order."""

    plugins: list[tuple[str, Any]]

    @classmethod
    def load(cls, names: list[str]) -> Plugins:
        check_installed(names)
        available = installed()
        made = []
        for name in names:
            try:
                made.append((name, available[name].load()()))
            except Exception as exc:
                raise PluginError(f"checkpoint plugin {name!r} ({available[name].value}) failed to load: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return cls(made)

    def call(self, hook: str, *args) -> None:
        """Run ``hook`` of every plugin that defines it; the first that raises ends the run with PluginError."""
        assert hook in HOOKS, hook
        for name, plugin in self.plugins:
            method = getattr(plugin, hook, None)
            if method is None:
                continue
            try:
                method(*args)
            except Exception as exc:
                raise PluginError(f"checkpoint plugin {name!r} failed in {hook}: {type(exc).__name__}: {exc}") \
                    from exc
