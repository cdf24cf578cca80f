"""The start-up report of `rlx train` (rlx.launch.startup) from the launcher's marks and its servers': a server
started anew (no standby) and one that reports nothing (an older rlx's) both leave a line that says what is known."""

from __future__ import annotations

from rlx.launch.startup import describe, startup_report

LAUNCHER = {"started": 1000.0, "launch": 1018.0, "trainer_built": 1026.0, "warmed_up": 1033.0, "servers_ready": 1077.0}


def test_a_server_started_anew_and_one_that_reports_nothing():
    servers = {
        "rollout0": {"started": 1018.5, "engine_start": 1043.0, "engine_ready": 1076.5},  # no standby: no imports mark
        "rollout1": {},  # reports no start-up
    }
    report = startup_report(LAUNCHER, servers)
    assert report["launch_s"] == 18.0 and report["servers_ready_s"] == 77.0
    assert report["servers"] == {
        "rollout0": {"started_s": 18.5, "engine_start_s": 43.0, "ready_s": 76.5, "engine_s": 33.5}
    }
    line = describe(report)
    assert line == (
        "start-up: the servers were ready 77.0 s after the command; 18.0 s to the launch (rlx's imports, the config, "
        "the pre-flight); rollout0 ready at 76.5 s (started at 18.5 s, its engine from 43.0 s, 33.5 s); the trainer "
        "built in 8.0 s and warmed up in 7.0 s, then waited 44.0 s"
    )
