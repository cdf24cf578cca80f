"""Weight syncs between two GPUs of one host (skipped with fewer): NCCL from GPU 0 to a receiver process on
GPU 1, and CUDA IPC peer-to-peer into a receiver on GPU 1 that sees GPU 0 after its own, both verified."""

import asyncio

import pytest
import torch

from rlx.bench.sync import receiver_env
from tests.sync.test_sync_cuda_ipc import gpu_tensors

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")


@pytest.mark.parametrize("transport", ["nccl", "cuda_ipc"])
def test_a_sync_to_a_receiver_on_another_gpu_is_verified(spawn_receiver, sync_send, transport):
    _, address = spawn_receiver(env=receiver_env(1))
    tensors = gpu_tensors()
    reports = asyncio.run(
        sync_send(tensors, [address], transport=transport, device="cuda", bucket_mb=1, verify=True, timeout_s=60)
    )
    for report in reports:
        assert report.transport == transport and report.verified and report.num_tensors == len(tensors)
