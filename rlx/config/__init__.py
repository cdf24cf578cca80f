"""Run configuration: dataclass schema + Hydra loading. Imports no torch or vLLM."""

from rlx.config.errors import ConfigError
from rlx.config.load import load_config
from rlx.config.schema import RunConfig

__all__ = ["ConfigError", "RunConfig", "load_config"]
