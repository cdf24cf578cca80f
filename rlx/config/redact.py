"""Secrets kept out of everything a run writes: config files, logs, metric sinks (W&B).

A field is secret when its name is in ``SECRET_FIELDS``; its value is replaced by
``REDACTED`` (an empty value stays empty, so a reader can still tell it was unset).
Children that need a secret get it through their environment, never through a file.
"""

from __future__ import annotations

from typing import Any

SECRET_FIELDS = frozenset({"auth_token"})
REDACTED = "***"
SECRET_ENV = {"rollout.auth_token": "RLX_ROLLOUT_AUTH_TOKEN"}
"""The environment variable each secret key reaches the run's children in."""


def redacted(cfg: Any) -> dict:
    """The resolved config as a plain dict with every secret field replaced by ``REDACTED``."""
    from omegaconf import OmegaConf

    data = cfg if isinstance(cfg, dict) else OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    return _walk(data)


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if k in SECRET_FIELDS and v else _walk(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v) for v in value]
    return value
