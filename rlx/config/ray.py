"""The ``ray`` section (launcher=ray): the cluster to join and each role's resources."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlx.config.checks import check_choice, check_range
from rlx.config.errors import ConfigError

RAY_STRATEGY_CHOICES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})")
RAY_ADDRESS_FORMS = "auto, local, HOST:PORT (the GCS of a running cluster, e.g. 10.0.0.5:6379) or ray://HOST:PORT"


def check_ray_address(where: str, value: str) -> None:
    """A Ray address in a form ``ray.init`` takes: ``auto``, ``local``, ``HOST:PORT`` or ``ray://HOST:PORT``
    (IPv6 hosts in brackets); empty passes (it means: RAY_ADDRESS, else a local instance)."""
    if value in ("", "auto", "local"):
        return
    match = _HOST_PORT.fullmatch(value.removeprefix("ray://"))
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        empty = (
            "leave it empty to start a local instance"
            if where == "RAY_ADDRESS"
            else "leave it empty to use RAY_ADDRESS, else start a local instance"
        )
        raise ConfigError(f"{where}={value!r} is not a Ray address; set it to {RAY_ADDRESS_FORMS}, or {empty}")


@dataclass
class RayConfig:
    address: str = ""
    """Ray cluster to join (launcher=ray): "auto" = the one running here, ray://... or host:port; empty = RAY_ADDRESS,
    else start a local instance."""
    trainer_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    """Ray resources of one trainer rank (its placement-group bundle), e.g. {CPU: 8, GPU: 1}."""
    rollout_resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    """Ray resources of one launched rollout server (its placement-group bundle), e.g. {CPU: 8, GPU: 1}."""
    strategy: str = "PACK"
    """Placement-group strategy of each role's bundles: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD."""
    placement_timeout_s: float = 120.0
    """How long to wait for the cluster to grant a role's placement group before naming what is missing."""

    def __post_init__(self) -> None:
        check_ray_address("ray.address", self.address)
        check_choice("ray.strategy", self.strategy, RAY_STRATEGY_CHOICES)
        check_range("ray.placement_timeout_s", self.placement_timeout_s, 0.1)
        for role in ("trainer", "rollout"):
            for name, amount in getattr(self, f"{role}_resources").items():
                check_range(
                    f"ray.{role}_resources.{name}",
                    amount,
                    0.0,
                    hint=f"set ray.{role}_resources to the amount of each resource one {role} process needs",
                )
