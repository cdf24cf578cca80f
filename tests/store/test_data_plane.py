"""trainer.data_plane=store: two gloo ranks, each pulling its own rows from the sample store, train
exactly as when rank 0 broadcasts the whole batch, and rank 0 sends the same bytes whatever the batch."""

import glob
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("ranks_store.py")


def run_world(model_dir, output_dir) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), str(model_dir), str(output_dir)],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            result = next(line for line in out.splitlines() if line.startswith("RESULT"))
            results.append(json.loads(result[len("RESULT") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_ranks_pull_disjoint_shares_and_match_the_broadcast(tiny_model_dir, tmp_path):
    before = set(glob.glob("/dev/shm/rlx-store-*"))
    lead, rank1 = run_world(tiny_model_dir, tmp_path)
    broadcast, store, follower = lead["broadcast"], lead["store"], rank1["store"]

    assert store["loss"] == pytest.approx(broadcast["loss"], abs=1e-5)
    for plan, fetched in zip(store["plans"], follower["fetched"], strict=True):  # rank 1 read exactly its plan's rows
        assert fetched == plan[1]
        assert not set(plan[0]) & set(plan[1]) and len(fetched) < len(plan[0]) + len(plan[1])
    small, large = store["control_bytes"]
    assert small == large  # the second batch has twice the rows and 8x longer completions
    assert broadcast["control_bytes"][1] > 3 * broadcast["control_bytes"][0]
    assert small < broadcast["control_bytes"][0]
    assert [s["store_bytes_put"] > 0 for s in store["store"]] == [True, True]
    assert set(glob.glob("/dev/shm/rlx-store-*")) <= before  # rank 0 closed it; nothing left behind

    tcp, tcp_follower = lead["store_tcp"], rank1["store_tcp"]  # store.transport=tcp: rows over a socket
    assert tcp["handle_kind"] == "tcp" and tcp["requests_served"] > 0
    assert tcp["loss"] == pytest.approx(broadcast["loss"], abs=1e-5)
    assert [plan[1] for plan in tcp["plans"]] == tcp_follower["fetched"]
    assert tcp["control_bytes"] == store["control_bytes"]  # only the notice, whatever the transport
