"""store.transport=tcp: a reader in another process fetches rows from the producer over a real socket,
bit-exact; released rows are refused as in shm; a wrong token is refused; a dead producer is named."""

import json
import os
import subprocess
import sys

import pytest
import torch

from rlx.store.base import RowGone, Sample, StoreHandle, create_store, open_reader
from rlx.store.tcp import StoreRefused, TcpStore, TcpStoreReader

READER = """
import json, sys
from rlx.store.base import StoreHandle, open_reader
import msgspec
reader = open_reader(msgspec.json.decode(sys.argv[1], type=StoreHandle))
rows = json.loads(sys.argv[2])
out = []
for s in reader.get(rows):
    out.append({"prompt": s.prompt_ids.tolist(), "completion": s.completion_ids.tolist(), "logp": s.logprobs.tolist(),
                "mask": s.loss_mask.tolist(), "versions": None if s.versions is None else s.versions.tolist(),
                "meta": [s.reward, s.prompt_id, s.group, s.status]})
print(json.dumps({"rows": out, "loss_tokens": reader.meta(rows)["loss_tokens"].tolist()}))
reader.close()
"""


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


def test_a_reader_process_gets_exact_rows_and_released_rows_are_refused():
    import msgspec

    store = create_store("tcp", 1, 64, timeout_s=20.0)
    try:
        rows = store.put([sample(i) for i in range(6)] + [sample(9, 0)])  # the last: an empty completion
        handle = store.handle()
        assert handle.kind == "tcp" and handle.name.startswith("tcp://127.0.0.1:")
        env = dict(os.environ)
        env.pop("RLX_ROLLOUT_AUTH_TOKEN", None)
        done = subprocess.run(
            [sys.executable, "-c", READER, msgspec.json.encode(handle).decode(), json.dumps(rows[2:])],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        got = json.loads(done.stdout)
        for want, g in zip(store.get(rows[2:]), got["rows"], strict=True):  # the producer's own bytes
            assert g["prompt"] == want.prompt_ids.tolist() and g["completion"] == want.completion_ids.tolist()
            assert torch.equal(torch.tensor(g["logp"], dtype=torch.float32).reshape(-1), want.logprobs)
            assert g["mask"] == want.loss_mask.tolist() and g["versions"] == want.versions.tolist()
            assert g["meta"] == [want.reward, want.prompt_id, want.group, want.status]
        assert got["loss_tokens"] == [3.0, 3.0, 3.0, 3.0, 0.0]

        reader = open_reader(handle)
        store.release(rows[:2])
        with pytest.raises(RowGone, match="row 1 was released"):
            reader.get([1])
        with pytest.raises(RowGone, match="row 0 was released"):
            reader.meta([0, 3])
        assert reader.get([3])[0].prompt_id == 103  # the server stays up after a refusal
        reader.close()
    finally:
        store.close()


def test_a_wrong_token_is_refused_and_non_loopback_needs_one():
    store = TcpStore(1 << 16, 8, host="127.0.0.1", token="s3cret", timeout_s=10.0)
    try:
        store.put([sample(1)])
        for token in ("wrong", ""):
            reader = TcpStoreReader(store.handle(), token=token)
            with pytest.raises(StoreRefused, match="bad or missing auth token; set rollout.auth_token"):
                reader.get([0])
            reader.close()
        reader = TcpStoreReader(store.handle(), token="s3cret")
        assert reader.get([0])[0].prompt_id == 101
        reader.close()
    finally:
        store.close()
    non_loopback = _an_address_not_loopback()
    if non_loopback:
        with pytest.raises(ValueError, match="needs an auth token: set rollout.auth_token"):
            TcpStore(1 << 16, 8, host=non_loopback, token="")
        store = TcpStore(1 << 16, 8, host=non_loopback, token="s3cret", timeout_s=10.0)
        try:
            assert store.handle().name.startswith(f"tcp://{non_loopback}:")
            store.put([sample(2)])
            reader = TcpStoreReader(store.handle(), token="s3cret")
            assert reader.get([0])[0].prompt_id == 102
            reader.close()
        finally:
            store.close()


def test_a_silent_producer_is_named_when_the_deadline_passes():
    import zmq

    silent = zmq.Context.instance().socket(zmq.ROUTER)  # binds, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    reader = TcpStoreReader(StoreHandle("tcp", f"tcp://127.0.0.1:{port}", 0, 8, 0.3), token="")
    try:
        with pytest.raises(TimeoutError, match=f"sample store at tcp://127.0.0.1:{port} did not answer get"):
            reader.get([0])
    finally:
        reader.close()
        silent.close(linger=0)


def _an_address_not_loopback() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return ""
    return "" if ip.startswith("127.") else ip


def test_a_request_for_too_many_or_repeated_rows_is_refused_and_a_reader_folds_repeats():
    import msgspec
    import zmq

    from rlx.store.tcp import VERSION, Reply, Request, max_request_bytes

    store = TcpStore(1 << 16, 8, host="127.0.0.1", token="", timeout_s=10.0)
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(store.handle().name)

    def ask(payload: bytes) -> Reply:
        raw.send_multipart([b"\0" * 8, payload])
        assert raw.poll(10_000), "the store did not answer"
        return msgspec.msgpack.decode(raw.recv_multipart()[1], type=Reply)

    try:
        rows = store.put([sample(i) for i in range(3)])
        for op in ("get", "meta"):
            reply = ask(msgspec.msgpack.encode(Request(VERSION, op, [rows[0]] * 1000)))
            assert reply.error_kind == "bad_request" and reply.rows == [] and reply.tensors == []
            assert "a request for 1000 rows; rank 0's store holds at most 8 (store.max_rows)" in reply.error
            reply = ask(msgspec.msgpack.encode(Request(VERSION, op, [rows[0], rows[1], rows[0], rows[0]])))
            assert reply.error == "a request names 2 rows more than once; name each row once"
        # a request larger than any a reader sends: its sender is cut off unread, the store serves the others
        raw.send_multipart([b"\0" * 8, b"\x00" * (max_request_bytes(8) + 1)])
        reader = TcpStoreReader(store.handle(), token="")
        got = reader.get([rows[2], rows[0], rows[2]])
        assert [s.prompt_id for s in got] == [102, 100, 102]
        assert reader.meta([rows[1], rows[1]])["prompt_id"].tolist() == [101, 101]
        assert not raw.poll(100)  # answered in order: a reply to the oversized request would be here by now
        reader.close()
    finally:
        raw.close(linger=0)
        store.close()
