"""A rollout server's standby process: started before `rlx train`'s pre-flight, it imports its engine meanwhile and
becomes the server when handed its command line; a run that ends in pre-flight leaves none of them behind."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from rlx.launch.processes import Child, child_env, python_argv
from tests.helpers import start_rlx, stop_group
from tests.launch.test_train import small_config


def test_a_standby_becomes_the_command_it_is_handed_and_streams_its_output_from_then(tmp_path):
    lines: list[str] = []
    child = Child("rollout0", python_argv("rlx.cli.standby", "hf"), child_env(None), None, print, standby=True)
    try:
        assert child.log_path is None and child.alive()  # no log, no command line yet: it only imports
        argv = python_argv("rlx", "--version")
        child.go(argv, ["--version"], tmp_path / "rollout0.log", lines.append)
        assert child.proc.wait(60) == 0
    finally:
        child.stop(timeout_s=2.0)
    log = (tmp_path / "rollout0.log").read_text()
    assert log.startswith(f"rlx: starting rollout0: {' '.join(argv)}")  # the command a restart would run
    assert "rlx: standby: the hf server's imports took" in log
    assert any(line.startswith("[rollout0] rlx ") for line in lines)  # its --version line, through the console
    assert child.argv == argv


def test_a_standby_that_gets_no_command_line_ends_having_done_nothing(tmp_path):
    child = Child("rollout0", python_argv("rlx.cli.standby", "hf"), child_env(None), None, print, standby=True)
    child.stop(timeout_s=5.0)  # its stdin closes: an empty line, it returns; SIGTERM ends it if it still imports
    assert not child.alive() and child.log_path is None


def _marked(marker: str) -> set[int]:
    """Live processes whose environment holds ``marker`` (started by the run under test, nothing else)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def test_a_run_refused_in_pre_flight_stops_the_standby_it_started(tiny_model_dir, tmp_path):
    marker = f"RLX_TEST_RUN={uuid.uuid4().hex}"
    name, value = marker.split("=")
    config = small_config(
        tmp_path, tiny_model_dir, "hf", task={"name": "gsm8k", "path": str(tmp_path / "missing.jsonl")}
    )
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config)], log, env={name: value})
    seen: set[int] = set()
    try:
        while proc.poll() is None:
            seen |= _marked(marker) - {proc.pid}
            time.sleep(0.05)
    finally:
        stop_group(proc)
    assert proc.returncode == 2, log.read_text()[-2000:]
    assert "no such file or directory" in log.read_text()
    assert seen, "no standby was started beside the pre-flight"
    assert not _marked(marker), "a standby outlived the refused run"
    assert not (tmp_path / "run" / "logs").exists()  # nothing of the run was written


SETS_ITS_VARIABLE = """
import os

os.environ["RLX_TEST_LIBRARY_CACHE"] = "/somewhere"  # as torch's compiler sets TORCHINDUCTOR_CACHE_DIR when imported


def score(completion, answer):
    return float(len(completion) % 2)
"""


def test_the_standby_becomes_the_server_though_the_launchers_libraries_set_variables_meanwhile(
    tiny_model_dir, tmp_path
):
    """The pre-flight imports code that sets a variable in the launcher's environment (a reward module here; on a
    GPU, torch's compiler): the standby, started before, lacks it, and still becomes the server."""
    (tmp_path / "lib_reward.py").write_text(SETS_ITS_VARIABLE)
    config = small_config(tmp_path, tiny_model_dir, "hf", task={"reward": "lib_reward:score"})
    log = tmp_path / "train.log"
    proc = start_rlx(["train", str(config), "trainer.total_steps=1"], log, env={"PYTHONPATH": str(tmp_path)})
    try:
        proc.wait(300)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
    run_log = (tmp_path / "run" / "logs" / "train.log").read_text()
    assert "started anew" not in run_log, run_log
    assert "rlx: standby: the hf server's imports took" in (tmp_path / "run" / "logs" / "rollout0.log").read_text()
    # the run log says where the start-up went, the standby's imports beside the pre-flight among it
    report = json.loads((tmp_path / "run" / "logs" / "startup.json").read_text())
    server = report["servers"]["rollout0"]
    assert 0 < server["started_s"] < report["launch_s"] <= server["engine_start_s"] < server["ready_s"]
    assert server["ready_s"] <= report["servers_ready_s"]
    assert server["imports_s"] > 0 and server["waited_s"] >= 0 and server["engine_s"] > 0
    assert server["started_s"] + server["imports_s"] + server["waited_s"] == pytest.approx(
        server["command_s"], abs=0.05
    )
    assert report["launch_s"] < report["trainer_built_s"] <= report["warmed_up_s"] <= report["servers_ready_s"]
    line = next(x for x in run_log.splitlines() if "start-up:" in x)
    assert f"the servers were ready {report['servers_ready_s']:.1f} s after the command" in line
    assert f"rollout0 ready at {server['ready_s']:.1f} s (started at {server['started_s']:.1f} s" in line
    assert f"its engine from {server['engine_start_s']:.1f} s, {server['engine_s']:.1f} s" in line
