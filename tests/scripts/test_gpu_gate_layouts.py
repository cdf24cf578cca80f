"""scripts/gpu_gate.py's layouts are valid before any GPU runs them: each config with its overrides passes the
placement check and plans on exactly the GPUs the layout claims (peer access assumed), a tensor-parallel engine
splits the real model's heads, and a layout is refused on a host with fewer GPUs, naming those that fit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gate():
    spec = importlib.util.spec_from_file_location("gpu_gate", ROOT / "scripts" / "gpu_gate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_gate"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_layout_plans_on_the_gpus_it_claims(gate, smollm2_dir):
    from rlx import placement
    from rlx.config import load_config
    from rlx.config.roles import rollout_role
    from rlx.rollout.preflight import check_rollout

    def reach(a: int, b: int) -> bool:
        return True

    for name, (config, gpus, overrides) in gate.LAYOUTS.items():
        smollm2 = "smollm2" in config
        extra = [f"model.path={smollm2_dir}"] if smollm2 else []
        cfg = load_config(ROOT / config, [*overrides, *extra])
        servers = rollout_role(cfg)
        placement.check(servers, cfg.trainer, gpus, peer_access=reach)
        plan = placement.plan(servers, cfg.trainer, gpus, peer_access=reach)
        used = {d for slot in (*plan.trainer, *plan.rollout) for d in slot.devices}
        assert used == set(range(gpus)), (name, plan)
        if smollm2:
            check_rollout(servers)  # the engine's GPUs split the real model's heads
        with pytest.raises(Exception, match="GPU"):
            placement.check(servers, cfg.trainer, gpus - 1, peer_access=reach)


def test_a_layout_needing_more_gpus_than_the_host_has_is_refused(gate):
    assert gate.check_jobs(None, 2) == [name for name, (_, need, _) in gate.LAYOUTS.items() if need <= 2]
    assert "dp2" in gate.check_jobs(None, 4)
    with pytest.raises(SystemExit, match=r"dp2 need\(s\) more GPUs than the 2 this host shows.*separate"):
        gate.check_jobs(["separate", "dp2"], 2)


def test_jobs_land_on_the_gates_own_gpus_when_it_is_confined(gate):
    assert gate.physical_gpus([0, 1], "2,3") == "2,3"
    assert gate.physical_gpus([1], " 5, 7") == "7"
    assert gate.physical_gpus([0, 2], None) == "0,2"


def test_merge_joins_reports_of_one_layout_and_summarises_them_again(gate, tmp_path):
    """Two gates of the colocated layout on other seeds (two device calls) make one report: the runs joined, the
    means and medians over both; reports of another device or step count are refused, naming the field."""
    import json

    def run(seed: int, end: float, step_s: float) -> dict:
        return {
            "exit_code": 0,
            "heldout_start": 0.2,
            "heldout_end": end,
            "reward_last5": 0.2,
            "dlogp_mean": 0.05,
            "syncs": 10,
            "syncs_verified": 10,
            "step_s": step_s,
            "sync_s": 0.25,
            "leftovers": {"count": 0},
        }

    meta = {"device": "GPU", "vllm_version": "0.25.1", "command": "gate", "steps": 10, "host_leftovers": []}
    paths = []
    for seed, end, step_s in ((1, 0.3, 2.0), (2, 0.4, 3.0)):
        path = tmp_path / f"s{seed}" / "gpu_gate_colocated.json"
        path.parent.mkdir()
        report = gate.layout_report("colocated", {f"colocated_s{seed}": run(seed, end, step_s)}, meta)
        path.write_text(json.dumps(report))
        paths.append(str(path))
    merged = json.loads(gate.merge(paths, tmp_path).read_text())
    assert merged["seeds"] == [1, 2] and merged["syncs_verified"] == 20 and merged["leftovers"] == 0
    assert merged["heldout_end"] == pytest.approx(0.35) and merged["step_s"] == pytest.approx(2.5)
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(json.loads(Path(paths[0]).read_text()), steps=20)))
    with pytest.raises(SystemExit, match="differ in steps"):
        gate.merge([paths[0], str(other)], tmp_path)
