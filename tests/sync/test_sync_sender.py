"""WeightSender's argument checks and transport choice (no receiver needed)."""

import asyncio

import pytest
import torch

from rlx.sync.sender import WeightSender
from rlx.sync.transports import resolve_transport


@pytest.mark.parametrize("kwargs, match", [
    ({"bucket_mb": 0}, "sync.bucket_mb"),
    ({"num_buffers": 0}, "lock-step"),
    ({"timeout_s": 0}, "sync.timeout_s"),
    ({"transport": "carrier-pigeon"}, "auto, shm, cuda_ipc"),
])
def test_bad_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WeightSender(**kwargs)


def test_auto_transport_follows_the_device():
    assert resolve_transport("auto", "cpu") == "shm"
    assert resolve_transport("auto", "cuda:1") == "cuda_ipc"
    assert WeightSender(transport="auto").transport == "shm"


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
