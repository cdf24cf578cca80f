"""CUDA IPC transport: sender and receiver process share one GPU buffer (skipped without CUDA)."""

import asyncio

import pytest
import torch


def gpu_tensors():
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = [(f"layer{i}.w", torch.randn(300, 257, device="cuda", generator=g).to(torch.bfloat16)) for i in range(10)]
    tensors += [
        ("embed", torch.randn(700_000, device="cuda", generator=g)),  # 2.8 MB: split over 1 MiB slots
        ("scalar", torch.tensor(1.5, device="cuda")),
        ("empty", torch.empty(0, 4, device="cuda")),
    ]
    return tensors


@pytest.mark.gpu
@pytest.mark.parametrize("num_buffers", [1, 2], ids=["lock-step", "double-buffered"])
def test_cuda_ipc_round_trip_with_checksums(spawn_receiver, sync_send, num_buffers):
    _, address = spawn_receiver()
    tensors = gpu_tensors()
    reports = asyncio.run(
        sync_send(
            tensors,
            [address],
            transport="cuda_ipc",
            device="cuda",
            bucket_mb=1,
            num_buffers=num_buffers,
            verify=True,
            timeout_s=60,
        )
    )
    for report in reports:
        assert report.transport == "cuda_ipc" and report.verified and report.num_tensors == len(tensors)
        assert report.num_buckets >= 3


@pytest.mark.gpu
@pytest.mark.xfail(
    reason="on torch 2.11 a closed sender's IPC buffer stays allocated in the sender process, "
    "although every receiver's release is counted",
    strict=False,
)
def test_closed_cuda_ipc_sender_frees_its_buffer(spawn_receiver, sync_send):
    _, address = spawn_receiver()
    tensors = gpu_tensors()
    before = torch.cuda.memory_allocated()
    asyncio.run(sync_send(tensors, [address], transport="cuda_ipc", device="cuda", bucket_mb=1, timeout_s=60))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before


@pytest.mark.gpu
def test_cuda_ipc_slot_is_never_overwritten_before_its_ack(spawn_receiver, sync_send):
    _, address = spawn_receiver("--hold-s", "0.05", "--check-intact")
    tensors = [(f"w{i}", torch.full((200_000,), float(i), device="cuda")) for i in range(8)]
    reports = asyncio.run(
        sync_send(
            tensors,
            [address],
            transport="cuda_ipc",
            device="cuda",
            bucket_mb=1,
            num_buffers=2,
            verify=True,
            timeout_s=60,
        )
    )
    assert reports[-1].verified and reports[-1].num_buckets == 8


@pytest.mark.gpu
def test_cuda_weight_arena_sends_offsets_and_carries_every_update(spawn_receiver):
    from rlx.sync.arena import WeightArena
    from rlx.sync.channel import RpcSyncChannel
    from rlx.sync.sender import WeightSender

    _, address = spawn_receiver()
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 256), torch.nn.Linear(256, 1000)).cuda().to(torch.bfloat16)
    arena = WeightArena.adopt(model)
    assert all(arena.offset_of(p.data) is not None for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    channel = RpcSyncChannel.connect(address, name="gpu receiver")
    sender = WeightSender("cuda_ipc", bucket_mb=1, verify=True, timeout_s=60, device="cuda", arena=arena)

    async def rounds():
        reports = []
        for _ in range(3):
            model(torch.randint(0, 1000, (4, 8), device="cuda")).float().sum().backward()
            optimizer.step()  # the receiver's checksums are of its copies: each sync carries this update
            optimizer.zero_grad()
            reports.append(await sender.send([(n, p.detach()) for n, p in model.named_parameters()], [channel]))
        return reports

    try:
        reports = asyncio.run(rounds())
    finally:
        channel.close()
        sender.close()
        arena.close()
    assert all(r.transport == "cuda_ipc-arena" and r.verified for r in reports)
