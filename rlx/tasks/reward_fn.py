"""Loading a user reward function named ``module:function`` in the config.

The module is imported as is, so it must be importable from where ``rlx`` runs (on
``PYTHONPATH`` or installed). Any failure names the module, the function and the config key.
Sandboxing user code is left out: it runs in the controller process with full rights.
"""

from __future__ import annotations

import importlib
import traceback

from rlx.config.errors import ConfigError
from rlx.tasks.base import RewardFn


def load_reward_fn(spec: str, config_key: str = "task.reward") -> RewardFn:
    """Import ``module:function`` and check it is callable; errors name ``config_key``."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise ConfigError(f"{config_key}={spec!r} must be 'module:function', e.g. 'my_rewards:score'")
    if module_name.startswith("."):
        raise ConfigError(
            f"{config_key}={spec!r}: {module_name!r} is a relative module name; write the full "
            f"name of a module on PYTHONPATH, e.g. 'my_rewards:{function_name}'"
        )
    module = _import(module_name, spec, config_key)
    try:
        function = getattr(module, function_name)
    except AttributeError as exc:
        raise ConfigError(f"{config_key}={spec!r}: module {module_name!r} has no function {function_name!r}") from exc
    if not callable(function):
        raise ConfigError(
            f"{config_key}={spec!r}: {module_name}.{function_name} is a "
            f"{type(function).__name__}, not a function (completion, answer) -> float"
        )
    return function


def _import(module_name: str, spec: str, config_key: str):
    """Import the user's module; a failure inside it (syntax, an exception) is named with its file and line."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):  # the module itself is missing
            raise ConfigError(
                f"{config_key}={spec!r}: cannot import module {module_name!r} ({exc}); "
                "put it on PYTHONPATH or fix the module name"
            ) from exc
        failure = exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code may raise anything (even exit) while imported
        failure = exc
    raise ConfigError(
        f"{config_key}={spec!r}: importing {module_name!r} failed at {_where(failure)}: "
        f"{type(failure).__name__}: {failure}; fix the module (or test it with "
        f"python -c 'import {module_name}')"
    ) from failure


def _where(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "import time"
