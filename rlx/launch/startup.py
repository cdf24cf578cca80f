"""Where `rlx train`'s start-up went, from the command to the servers ready: one line in the run log and
``logs/startup.json``, from the launcher's marks and each server's (``rlx.trace.startup``, sent in its health
reply). All times are seconds from the command (the launcher process's start).

The launcher marks ``launch`` (its imports, the config and the pre-flight done, the servers started),
``trainer_built``, ``warmed_up`` and ``servers_ready``; a server marks ``imported`` and ``command`` when it
started as a standby (its imports beside the pre-flight, then its wait for the command line), and
``engine_start`` and ``engine_ready`` around its engine's start (which includes the engine's imports where no
standby made them).
"""

from __future__ import annotations

from pathlib import Path

from rlx.launch.processes import write_json
from rlx.trace import startup


def startup_report(launcher: dict[str, float], servers: dict[str, dict[str, float]]) -> dict:
    """``launcher``: the launcher's marks (``rlx.trace.startup.marks()``); ``servers``: each server's, by name."""
    t0 = launcher["started"]
    at = lambda marks, name: round(marks[name] - t0, 2) if name in marks else None  # noqa: E731
    report = {
        "launch_s": at(launcher, "launch"),
        "trainer_built_s": at(launcher, "trainer_built"),
        "warmed_up_s": at(launcher, "warmed_up"),
        "servers_ready_s": at(launcher, "servers_ready"),
        "servers": {},
    }
    for name, marks in servers.items():
        if "started" not in marks:  # a server that reports no start-up (an older rlx's)
            continue
        row = {"started_s": at(marks, "started"), "engine_start_s": at(marks, "engine_start")}
        row["ready_s"] = at(marks, "engine_ready")
        if "imported" in marks:
            row["imports_s"] = round(marks["imported"] - marks["started"], 2)
        if "command" in marks:
            row["command_s"] = at(marks, "command")
            row["waited_s"] = round(marks["command"] - marks["imported"], 2)
        if "engine_start" in marks and "engine_ready" in marks:
            row["engine_s"] = round(marks["engine_ready"] - marks["engine_start"], 2)
        report["servers"][name] = row
    return report


def describe(report: dict) -> str:
    """The report as one line of the run log."""
    parts = [f"start-up: the servers were ready {report['servers_ready_s']:.1f} s after the command"]
    parts.append(f"{report['launch_s']:.1f} s to the launch (rlx's imports, the config, the pre-flight)")
    for name, row in report["servers"].items():
        what = [f"started at {row['started_s']:.1f} s"]
        if "imports_s" in row:
            what.append(f"imports {row['imports_s']:.1f} s beside the pre-flight")
        if "command_s" in row:
            what.append(f"its command line at {row['command_s']:.1f} s")
        if row.get("engine_s") is not None:
            what.append(f"its engine from {row['engine_start_s']:.1f} s, {row['engine_s']:.1f} s")
        ready = f"{name} ready at {row['ready_s']:.1f} s" if row.get("ready_s") is not None else name
        parts.append(f"{ready} ({', '.join(what)})")
    if report["trainer_built_s"] is not None and report["warmed_up_s"] is not None:
        built = report["trainer_built_s"] - report["launch_s"]
        warm = report["warmed_up_s"] - report["trainer_built_s"]
        waited = report["servers_ready_s"] - report["warmed_up_s"]
        parts.append(f"the trainer built in {built:.1f} s and warmed up in {warm:.1f} s, then waited {waited:.1f} s")
    return "; ".join(parts)


def write_startup(run_dir: Path, servers: dict[str, dict[str, float]]) -> str:
    """Mark the servers ready, write ``logs/startup.json`` and return its line."""
    startup.mark("servers_ready")
    report = startup_report(startup.marks(), servers)
    write_json(run_dir / "logs" / "startup.json", report)
    return describe(report)
