"""``make_rollouts`` picks the collector from the config, and each kind answers the ``Rollouts`` interface."""

import pytest

from rlx.config import load_config
from rlx.orchestrator.collector import Collector
from rlx.orchestrator.external import ExternalCollector
from rlx.orchestrator.rollouts import Rollouts, make_rollouts
from rlx.rollout.client import RolloutClient
from rlx.tasks import build_task


@pytest.mark.parametrize(
    ("overrides", "kind", "multi_turn"),
    [
        (["task.name=tiny_math"], Collector, False),
        (["task.name=calc", "task.max_operand=99"], Collector, True),
        (
            ["task.name=external", "algorithm.advantage=reinforce_pp", "rollout.openai_port=18080"],
            ExternalCollector,
            False,
        ),
    ],
)
def test_the_config_picks_the_rollouts(tiny_model_dir, overrides, kind, multi_turn):
    cfg = load_config("configs/quickstart.yaml", [f"model.path={tiny_model_dir}", *overrides])
    client = RolloutClient(["ipc:///nonexistent-rollouts-test"])
    try:
        rollouts = make_rollouts(cfg, client, build_task(cfg.task, cfg.model.path))
        assert type(rollouts) is kind and isinstance(rollouts, Rollouts)
        assert (getattr(rollouts, "agent", None) is not None) == multi_turn
    finally:
        client.close()
