"""``Rollouts``: what rank 0's loop asks of whatever makes a step's samples, and ``make_rollouts``, which picks it.

Three kinds answer it, chosen by the config alone:

- ``task.name=external``: ``ExternalCollector``, the episodes an outside agent finished on the servers'
  OpenAI endpoint (it generates nothing itself);
- every other task: ``Collector``, which sends a step's prompts to the rollout servers and scores the
  groups, and runs multi-turn tasks (tools, OpenEnv) as episodes through its ``EpisodeCollector``.

The step source (``rlx.orchestrator.source``: filters, dumps, reuse) and the controller see only this
interface; ``trainer.mode=fully_async`` drives the ``Collector``'s group-at-a-time methods, which the
external agent's episodes do not need (they arrive as groups).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig
    from rlx.orchestrator.collector import Collected
    from rlx.rollout.client import RolloutClient
    from rlx.tasks import Problem, Task


@runtime_checkable
class Rollouts(Protocol):
    async def collect(self, problems: list[Problem], seed: int) -> Collected:
        """A step's scored samples for ``problems`` (``n`` per problem, problem-major), ``seed`` the step's."""

    async def evaluate(self, problems: list[Problem]) -> dict[str, float]:
        """Held-out metrics on ``problems``: ``accuracy``, and others where the task's evaluation has them."""


def make_rollouts(
    cfg: RunConfig,
    client: RolloutClient,
    task: Task,
    policy_version: Callable[[], int] = lambda: 0,
    note: Callable[[str], None] = lambda text: None,
) -> Rollouts:
    """The ``Rollouts`` of this run's config (``policy_version`` and ``note`` are the external agent's: what
    the trainer's policy is now, and a console line while the run waits for episodes)."""
    if cfg.task.name == "external":
        from rlx.orchestrator.external import ExternalCollector

        return ExternalCollector(cfg, client, policy_version, note)
    from rlx.orchestrator.collector import Collector

    return Collector(cfg, client, task)
