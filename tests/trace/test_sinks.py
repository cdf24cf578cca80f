"""Metric sinks write what a reader gets back: the TensorBoard event file read by TensorBoard's own
loader, the offline W&B run read from its transaction log (config and history records)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from rlx.config import load_config
from rlx.config.redact import REDACTED, redacted
from rlx.trace.sinks import MetricsLogger, read_metrics

LOSSES = {1: 0.5, 2: 0.25, 3: -0.125}
WANDB_BLOCK_BYTES = 32768  # the .wandb file is a LevelDB-style log of 32 KiB blocks
WANDB_FULL, WANDB_LAST = 1, 4


def run_config(tmp_path: Path, *overrides: str):
    path = tmp_path / "run.yaml"
    path.write_text(f"model: {{path: {tmp_path / 'model'}}}\nrun_name: sinks\n")
    return load_config(path, ["logging.console=false", "rollout.auth_token=s3cret-token", *overrides])


def log_steps(cfg, run_dir: Path) -> None:
    logger = MetricsLogger(cfg.logging, cfg.run_name, redacted(cfg), run_dir, resume_from_step=None)
    for step, loss in LOSSES.items():
        logger.log(step, {"loss": loss, "lr": 1e-4 * step})
    logger.close()


def test_tensorboard_event_file_holds_every_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_steps(run_config(tmp_path, "logging.tensorboard=true"), tmp_path)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"loss", "lr"} <= set(events.Tags()["scalars"])
    assert {e.step: e.value for e in events.Scalars("loss")} == pytest.approx(LOSSES)
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(LOSSES.values())


def test_wandb_offline_run_gets_the_redacted_config_and_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_steps(run_config(tmp_path, "logging.wandb=true", "algorithm.advantage=rloo"), tmp_path)
    logs = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, f"expected one offline run under {tmp_path}/wandb, found {logs}"
    config, history = read_wandb_run(logs[0])
    assert config["algorithm"]["advantage"] == "rloo"
    assert config["trainer"]["total_steps"] == 20  # the resolved config, defaults included
    assert config["rollout"]["auth_token"] == REDACTED
    assert "s3cret-token" not in logs[0].read_bytes().decode("latin-1")
    assert {row["_step"]: row["loss"] for row in history} == pytest.approx(LOSSES)


def read_wandb_run(path: Path, timeout_s: float = 60.0) -> tuple[dict, list[dict]]:
    """The run config and the history rows of an offline W&B run's transaction log.

    ``finish()`` can return before W&B's service process has written the log out, so this waits
    for the record that closes it (``exit``).
    """
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = list(wandb_records(path))
        except DecodeError:  # a record still being written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{path} got no exit record within {timeout_s:.0f}s"
        time.sleep(0.2)
    config, history = {}, []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates if not u.key.startswith("_")})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return config, history


def wandb_records(path: Path):
    """Protobuf records of a .wandb file: a 7-byte file header, then (crc32, length, type) framed chunks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        left_in_block = WANDB_BLOCK_BYTES - pos % WANDB_BLOCK_BYTES
        if left_in_block < 7:  # a block's tail too short for a header is padding
            pos += left_in_block
            continue
        length, chunk_type = struct.unpack_from("<HB", data, pos + 4)
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if chunk_type in (WANDB_FULL, WANDB_LAST):
            record = pb.Record()
            record.ParseFromString(payload)
            yield record
            payload = b""
