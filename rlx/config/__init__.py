"""Run configuration: dataclass sections, Hydra loading and each process role's view. Imports no torch or vLLM.

- ``schema``: ``RunConfig``, the whole run; one module per section beside it (``model``, ``task``, ``rollout``
  with ``SamplingConfig``, ``algorithm``, ``trainer``, ``sync``, ``store``, ``outputs``, ``placement``, ``ray``,
  ``agent``, ``reward_models``), each checking its own fields; ``checks``: the checks they share; ``cross``:
  the checks across sections.
- ``roles``: what a rollout server and a trainer rank read of the run, cut by the launcher, parsed by each.
- ``load``: Hydra composition, strict keys, overrides; ``yaml_file``: reading a config file; ``redact``: secrets.
"""

from rlx.config.errors import ConfigError
from rlx.config.load import load_config
from rlx.config.schema import RunConfig

__all__ = ["ConfigError", "RunConfig", "load_config"]
