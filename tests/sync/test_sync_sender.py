"""WeightSender's argument checks and transport choice (no receiver needed)."""

import asyncio

import pytest
import torch

from rlx.sync.factory import pick_transport
from rlx.sync.sender import WeightSender


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bucket_mb": 0}, "sync.bucket_mb"),
        ({"num_buffers": 0}, "lock-step"),
        ({"timeout_s": 0}, "sync.timeout_s"),
        ({"transport": "carrier-pigeon"}, "auto, shm, cuda_ipc"),
    ],
)
def test_bad_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WeightSender(**kwargs)


def test_auto_transport_follows_the_device_and_the_peers():
    assert pick_transport("auto", "cpu") == "shm"
    assert pick_transport("auto", "cuda:1") == "cuda_ipc"
    assert pick_transport("auto", "cpu", ["ipc:///tmp/a.sock", "tcp://127.0.0.1:5557"]) == "shm"
    assert pick_transport("auto", "cpu", ["ipc:///tmp/a.sock", "tcp://10.0.0.2:5557"]) == "gloo"
    assert pick_transport("auto", "cuda", ["tcp://10.0.0.2:5557"]) == "nccl"
    assert pick_transport("gloo", "cpu") == "gloo"
    assert WeightSender(transport="auto").transport == "shm"


def test_make_sender_adopts_the_model_only_when_zero_copy_can_work():
    from rlx.config.sync import SyncConfig
    from rlx.sync.factory import make_sender

    model = torch.nn.Linear(4, 4)
    with make_sender(SyncConfig(), "cpu", ["ipc:///tmp/a.sock"], module=model) as sender:
        assert sender.transport == "shm" and sender.arena is not None
        assert sender.arena.offset_of(model.weight.data) is not None  # the parameters live in the arena
        sender.arena.close()
    for cfg, peers in ((SyncConfig(zero_copy=False), []), (SyncConfig(), ["tcp://10.0.0.2:5557"])):
        with make_sender(cfg, "cpu", peers, module=torch.nn.Linear(4, 4)) as sender:
            assert sender.arena is None


def test_send_needs_a_receiver_and_rejects_duplicate_names(our_segments):
    with WeightSender() as sender:
        with pytest.raises(ValueError, match="at least one SyncChannel"):
            asyncio.run(sender.send([("w", torch.ones(2))], []))

        class Silent:
            name = "silent"

            async def call(self, request, timeout_s):
                from rlx.sync.messages import NO_ID, BucketAck

                sync_id = getattr(request, "sync_id", None) or request.meta.sync_id
                bucket_id = request.meta.bucket_id if hasattr(request, "meta") else NO_ID
                return BucketAck(sync_id, bucket_id, ok=True)

        with pytest.raises(ValueError, match="'w' appears twice"):
            asyncio.run(sender.send(iter([("w", torch.ones(2)), ("w", torch.ones(2))]), [Silent()]))
    assert our_segments() == []
