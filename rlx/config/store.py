"""Config sections of the sample store, rollout dumps and DAPO's sampling filters."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlx.config.errors import ConfigError

REUSE_CHOICES = ("", "replay", "first_k", "mix")
OVERLONG_CHOICES = ("off", "filter", "soft")


@dataclass
class StoreConfig:
    transport: str = "shm"
    """How trainer ranks read rows: shm (one /dev/shm segment; every rank on rank 0's host) or tcp (rank 0
    serves its rows over TCP on MASTER_ADDR's interface; ranks on several hosts)."""
    capacity_mb: int = 64
    """Bytes of sample data the store holds at once, in MiB (a step's batch, two in one_step_off)."""
    max_rows: int = 16384
    """Samples the store holds at once."""
    timeout_s: float = 60.0
    """tcp: seconds a trainer rank waits for rank 0 to answer one request for rows."""

    def __post_init__(self) -> None:
        if self.transport not in ("shm", "tcp"):
            raise ConfigError(
                f"store.transport={self.transport!r} is not allowed; set store.transport=shm (every "
                "trainer rank on rank 0's host) or store.transport=tcp (ranks on several hosts)"
            )
        if self.timeout_s <= 0:
            raise ConfigError(
                f"store.timeout_s={self.timeout_s} must be > 0; set it to the seconds a rank waits for rank 0's rows"
            )
        if self.capacity_mb < 1:
            raise ConfigError(
                f"store.capacity_mb={self.capacity_mb} must be >= 1; set it to the MiB of samples held at once"
            )
        if self.max_rows < 1:
            raise ConfigError(f"store.max_rows={self.max_rows} must be >= 1; set it to the samples held at once")


@dataclass
class FiltersConfig:
    drop_uniform_groups: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all agree (no advantage signal) and sample more prompts."""
    max_extra_rounds: int = 3
    """Extra rounds of prompts per step to refill dropped groups; after them the batch trains smaller."""
    overlong: str = "off"
    """Overlong samples (cut at rollout.max_tokens): off, filter (no loss on them) or soft (DAPO's linear
    length penalty over the last filters.overlong_buffer tokens)."""
    overlong_buffer: int = 0
    """soft: tokens before rollout.max_tokens where the penalty ramps from 0 to -filters.overlong_penalty."""
    overlong_penalty: float = 1.0
    """soft: the reward penalty at rollout.max_tokens."""
    max_group_tokens: int = 0
    """Drop a group whose completions hold more than this many tokens in all; 0 = no limit."""

    def __post_init__(self) -> None:
        if self.overlong not in OVERLONG_CHOICES:
            raise ConfigError(
                f"filters.overlong={self.overlong!r} is not allowed; set filters.overlong to one of: "
                + ", ".join(OVERLONG_CHOICES)
            )
        if self.max_extra_rounds < 0:
            raise ConfigError(f"filters.max_extra_rounds={self.max_extra_rounds} must be >= 0")
        if self.overlong == "soft" and self.overlong_buffer < 1:
            raise ConfigError(
                f"filters.overlong=soft needs filters.overlong_buffer >= 1 (got {self.overlong_buffer}); "
                "set it to the tokens before rollout.max_tokens where the penalty starts"
            )
        if self.overlong_penalty < 0:
            raise ConfigError(f"filters.overlong_penalty={self.overlong_penalty} must be >= 0")
        if self.max_group_tokens < 0:
            raise ConfigError(f"filters.max_group_tokens={self.max_group_tokens} must be >= 0 (0 = no limit)")

    @property
    def active(self) -> bool:
        return self.drop_uniform_groups or self.overlong != "off" or self.max_group_tokens > 0


def check_reuse(rollout) -> None:
    """``rollout.reuse`` and the fields it needs (the dump itself is checked by pre-flight)."""
    if rollout.reuse not in REUSE_CHOICES:
        raise ConfigError(
            f"rollout.reuse={rollout.reuse!r} is not allowed; set rollout.reuse to one of: "
            "replay, first_k, mix (or leave it empty)"
        )
    if rollout.reuse and not rollout.reuse_dir:
        raise ConfigError(
            f"rollout.reuse={rollout.reuse} needs rollout.reuse_dir: set it to the rollout.dump_dir "
            "of the run that wrote the dump"
        )
    if rollout.reuse == "first_k" and rollout.reuse_steps < 1:
        raise ConfigError(
            f"rollout.reuse=first_k needs rollout.reuse_steps >= 1 (got {rollout.reuse_steps}): "
            "the steps taken from the dump before generating"
        )
    if rollout.reuse == "mix" and not 0.0 < rollout.reuse_fraction <= 1.0:
        raise ConfigError(
            f"rollout.reuse=mix needs rollout.reuse_fraction in (0, 1] (got {rollout.reuse_fraction}): "
            "the fraction of each step's prompts taken from the dump"
        )
    if (
        rollout.dump_dir
        and rollout.reuse_dir
        and os.path.abspath(rollout.dump_dir) == os.path.abspath(rollout.reuse_dir)
    ):
        raise ConfigError(
            "rollout.dump_dir and rollout.reuse_dir name the same directory; a run cannot "
            "overwrite the dump it reads: set rollout.dump_dir elsewhere or leave it empty"
        )
