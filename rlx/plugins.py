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

Pre-flight imports and makes every configured plugin once, so a missing module or a factory that
raises stops the run before any process starts; the controller then makes its own. Hooks run on
the controller (trainer rank 0), in the order the config lists the plugins. A hook that raises ends
the run with ``PluginError`` naming the plugin and the hook; a failed save hook leaves no new
checkpoint (the staged directory is removed), so the newest complete one is the previous checkpoint.
Left out: plugins on other ranks or in the rollout servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP = "rlx.plugins"
HOOKS = ("on_save", "on_load", "after_step")


class PluginError(RuntimeError):
    """A checkpoint plugin could not be made, or its hook raised; the message names the plugin, the hook and
    the error."""


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
        raise ConfigError(
            f"checkpoint.plugins names {missing[0]!r}, which is not an installed rlx plugin "
            f"(installed: {listed}); install the package that provides it (entry-point group "
            f"{GROUP!r}) or remove it from checkpoint.plugins"
        )


def make(name: str, entry_point) -> Any:
    """The plugin ``entry_point`` makes: its object imported, then called with no arguments. Either step
    failing raises ``PluginError`` naming the plugin, what failed and the fix."""
    remove = f"or remove {name!r} from checkpoint.plugins"
    try:
        factory = entry_point.load()
    except Exception as exc:
        raise PluginError(
            f"checkpoint plugin {name!r} ({entry_point.value}) cannot be imported: "
            f"{type(exc).__name__}: {exc}; reinstall the package that provides it, {remove}"
        ) from exc
    try:
        return factory()
    except Exception as exc:
        raise PluginError(
            f"checkpoint plugin {name!r}: making it ({entry_point.value}, called with no arguments) "
            f"raised {type(exc).__name__}: {exc}; fix the plugin or its environment, {remove}"
        ) from exc


def check_loadable(names: list[str]) -> None:
    """Pre-flight: every name in ``checkpoint.plugins`` is installed, imports and is made without an error
    (a ``ConfigError`` naming the plugin and the fix), before any process of the run starts. The objects
    made here are dropped; the controller makes its own."""
    from rlx.config.errors import ConfigError

    check_installed(names)
    available = installed()
    for name in names:
        try:
            make(name, available[name])
        except PluginError as exc:
            raise ConfigError(str(exc)) from None


@dataclass
class Plugins:
    """The configured plugins, made, in config order."""

    plugins: list[tuple[str, Any]]

    @classmethod
    def load(cls, names: list[str]) -> Plugins:
        check_installed(names)
        available = installed()
        return cls([(name, make(name, available[name])) for name in names])

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
                raise PluginError(f"checkpoint plugin {name!r} failed in {hook}: {type(exc).__name__}: {exc}") from exc
