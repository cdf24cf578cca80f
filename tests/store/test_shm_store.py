"""The shared-memory sample store: rows round-trip exactly, released rows are refused, space is reused,
a full store names the key to raise, and a killed producer's segment is removed."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from rlx.store.base import RowGone, Sample, StoreFull
from rlx.store.shm import ShmStore, ShmStoreReader, remove_stale_segments


def sample(i: int, length: int = 5) -> Sample:
    return Sample(
        torch.arange(3) + i,
        torch.arange(length) * i,
        -torch.rand(length),
        float(i),
        torch.tensor([1.0, 0.0] * (length // 2) + [1.0] * (length % 2)),
        torch.full((length,), i),
        prompt_id=100 + i,
        group=i // 2,
        status=i % 3,
    )


def test_rows_round_trip_through_a_reader_and_released_rows_are_refused():
    store = ShmStore(1 << 16, 16)
    try:
        rows = store.put([sample(i) for i in range(6)])
        assert rows == list(range(6))
        reader = ShmStoreReader(store.handle())
        for row, got in zip(rows, reader.get(rows), strict=True):
            want = sample(row)
            for name in ("prompt_ids", "completion_ids", "loss_mask", "versions"):
                assert torch.equal(getattr(got, name), getattr(want, name)), name
            assert (got.reward, got.prompt_id, got.group, got.status) == (want.reward, 100 + row, row // 2, row % 3)
        meta = reader.meta(rows)
        assert meta["loss_tokens"].tolist() == [3.0] * 6 and meta["completion_len"].tolist() == [5] * 6
        store.release(rows[:2])
        with pytest.raises(RowGone, match="row 1 was released"):
            reader.get([1])
        assert store.stats()["store_rows_live"] == 4
        reader.close()
    finally:
        store.close()
    assert not os.path.exists(store.path)


def test_space_is_reused_after_release_and_a_full_store_names_the_fix():
    store = ShmStore(4096, 8)
    try:
        for _ in range(50):  # 50 x 4 rows through room for about 12
            store.release(store.put([sample(i, 20) for i in range(4)]))
        store.put([sample(i, 20) for i in range(8)])
        with pytest.raises(StoreFull, match="store.max_rows"):
            store.put([sample(0)])
        store.release(list(range(200, 208)))
        with pytest.raises(StoreFull, match="store.capacity_mb"):
            store.put([sample(0, 400)])
    finally:
        store.close()


def test_a_killed_producers_segment_is_removed():
    code = (
        "import sys, time; from rlx.store.shm import ShmStore; s = ShmStore(4096, 4); "
        "print(s.path, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    assert os.path.exists(path)
    assert path not in remove_stale_segments()  # its producer lives
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(path)  # no handler ran
    assert path in remove_stale_segments() and not os.path.exists(path)
