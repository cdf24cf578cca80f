"""Weights kept in a shared-memory arena: syncs send offsets, receivers copy once and keep the
arena mapped; real receiver processes over ZeroMQ, real /dev/shm segments."""

import asyncio

import pytest
import torch

from rlx.sync.arena import WeightArena
from rlx.sync.channel import RpcSyncChannel
from rlx.sync.layout import TensorSpec, resident_buckets
from rlx.sync.messages import BucketMeta, SyncBegin, SyncEnd
from rlx.sync.receiver import WeightReceiver
from rlx.sync.sender import WeightSender


def sample_tensors() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        ("embed", torch.randn(300, 64)),
        ("big", torch.randn(600_000)),  # over 2 MiB: larger than a bucket
        ("bf16", torch.randn(33, 7).to(torch.bfloat16)),
        ("scalar", torch.tensor(2.5)),
        ("empty", torch.empty(0, 3)),
        ("int", torch.arange(1000, dtype=torch.int64)),
    ]


async def sync_rounds(sender: WeightSender, tensors, address: str, rounds: int, between=lambda round_: None):
    channel = RpcSyncChannel.connect(address, name="arena receiver")
    reports = []
    try:
        for round_ in range(rounds):
            between(round_)
            reports.append(await sender.send(tensors, [channel]))
    finally:
        channel.close()
    return reports


def test_a_sync_from_the_arena_sends_offsets_and_carries_every_update(spawn_receiver, our_segments):
    _, address = spawn_receiver("--torch-threads", "1")
    arena = WeightArena(sum(t.numel() * t.element_size() + 256 for _, t in sample_tensors()))
    tensors = arena.place_all(sample_tensors())
    sender = WeightSender("shm", bucket_mb=1, verify=True, timeout_s=30, arena=arena)

    def optimizer_step(round_):  # between syncs the trainer changes its weights in place
        if round_:
            with torch.no_grad():
                for _, t in tensors:
                    if t.is_floating_point():
                        t.add_(1.0)

    try:
        reports = asyncio.run(sync_rounds(sender, tensors, address, rounds=3, between=optimizer_step))
    finally:
        sender.close()
        arena.close()
    for report in reports:
        # the receiver's checksums are of its own copies: each sync delivered the bytes of that moment
        assert report.transport == "shm-arena" and report.verified
        assert report.num_tensors == len(tensors)
        assert report.num_buckets >= 3  # "big" is a bucket of its own, never split
    assert our_segments() == [], "closing the arena must unlink its segment"


def test_tensors_outside_the_arena_go_through_the_slots(spawn_receiver):
    _, address = spawn_receiver("--torch-threads", "1")
    arena = WeightArena(4096)
    inside = arena.place(torch.ones(16))
    sender = WeightSender("shm", bucket_mb=1, verify=True, timeout_s=30, arena=arena)
    try:
        reports = asyncio.run(sync_rounds(sender, [("inside", inside), ("outside", torch.zeros(16))], address, 1))
    finally:
        sender.close()
        arena.close()
    assert reports[0].transport == "shm" and reports[0].verified


def test_adopt_moves_parameters_into_the_arena_and_keeps_them_trainable():
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50, bias=True))
    model[1].weight = model[0].weight  # tied, like a language model's head
    params_before = list(model.parameters())
    values = [p.detach().clone() for p in params_before]
    arena = WeightArena.adopt(model)
    try:
        assert list(model.parameters()) == params_before  # the same Parameter objects (the optimizer's)
        assert all(arena.offset_of(p.data) is not None for p in model.parameters())
        assert [torch.equal(p, v) for p, v in zip(model.parameters(), values, strict=True)] == [True] * len(values)
        assert model[1].weight.data_ptr() == model[0].weight.data_ptr()  # tied weights share one place
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.tensor([[1, 2, 3]])).sum().backward()
        optimizer.step()
        assert all(arena.offset_of(p.data) is not None for p in model.parameters())
        assert not torch.equal(model[0].weight, values[0])  # the step wrote into the arena
    finally:
        arena.close()


def test_arena_rejects_what_does_not_fit_or_is_not_inside():
    arena = WeightArena(1280)
    try:
        arena.place(torch.ones(200))  # 800 bytes, the next tensor starts at 1024
        with pytest.raises(ValueError, match="bytes left"):
            arena.place(torch.ones(200))
        assert arena.offset_of(torch.ones(4)) is None
        assert arena.offset_of(arena.place(torch.ones(4))[1:]) is not None
    finally:
        arena.close()


def test_receiver_keeps_the_arena_mapped_but_not_a_view_held_past_the_end():
    arena = WeightArena(4096)
    tensor = arena.place(torch.arange(8, dtype=torch.float32))
    chunks = next(resident_buckets([(TensorSpec("w", "float32", [8], 32), arena.offset_of(tensor))], 1 << 20)).chunks
    receiver = WeightReceiver()
    try:
        for sync_id in (1, 2):
            receiver.begin(SyncBegin(sync_id, arena.handle(), 1, 32, False))
            meta = BucketMeta(sync_id, 0, 0, chunks, True)
            assert torch.equal(receiver.tensors(meta)[0][1], tensor)
            receiver.ack(meta)
            assert receiver.end(SyncEnd(sync_id)).ok
            if sync_id == 1:
                mapping = receiver._resident
            assert mapping is not None and mapping.keep_mapped and receiver._resident is mapping  # mapped once
        receiver.begin(SyncBegin(3, arena.handle(), 1, 32, False))
        assert receiver._mapping is mapping
        meta = BucketMeta(3, 0, 0, chunks, True)
        held = receiver.tensors(meta)[0][1]  # a consumer that keeps the engine's tensor over the trainer's memory
        receiver.ack(meta)
        ack = receiver.end(SyncEnd(3))
        assert not ack.ok and "still referenced" in ack.error
        del held
    finally:
        receiver.close()
        arena.close()


def test_resident_buckets_group_whole_tensors_at_their_offsets():
    specs = [
        (TensorSpec(f"t{i}", "float32", [n // 4], n), offset)
        for i, (n, offset) in enumerate([(400, 0), (3000, 512), (500, 3584), (100, 4096)])
    ]
    buckets = list(resident_buckets(specs, 1024))
    assert [[c.name for c in b.chunks] for b in buckets] == [["t0"], ["t1"], ["t2", "t3"]]
    assert [c.offset for b in buckets for c in b.chunks] == [0, 512, 3584, 4096]
    assert all(c.nbytes == c.total_nbytes and c.chunk_start == 0 for b in buckets for c in b.chunks)
    assert [b.is_last for b in buckets] == [False, False, True]
