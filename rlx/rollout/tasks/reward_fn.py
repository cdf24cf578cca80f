"""Loading a user reward function named ``module:function`` in the config.

The module is imported as is, so it must be importable from where ``rlx`` runs (on
``PYTHONPATH`` or installed). Any failure names the module, the function and the config key.
Sandboxing user code is left out: it runs in the controller process with full rights.
"""

from __future__ import annotations

import importlib

from rlx.config.errors import ConfigError
from rlx.rollout.tasks.base import RewardFn


def load_reward_fn(spec: str, config_key: str = "task.reward") -> RewardFn:
    """Import ``module:function`` and check it is callable; errors name ``config_key``."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise ConfigError(f"{config_key}={spec!r} must be 'module:function', e.g. 'my_rewards:score'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{config_key}={spec!r}: cannot import module {module_name!r} ({exc}); "
                          "put it on PYTHONPATH or fix the module name") from exc
    try:
        function = getattr(module, function_name)
    except AttributeError as exc:
        raise ConfigError(f"{config_key}={spec!r}: module {module_name!r} has no function {function_name!r}") from exc
    if not callable(function):
        raise ConfigError(f"{config_key}={spec!r}: {module_name}.{function_name} is a "
                          f"{type(function).__name__}, not a function (completion, answer) -> float")
    return function
