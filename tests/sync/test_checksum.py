"""The sync checksum: one value per byte pattern whatever the dtype's meaning, changed by any torn, swapped or
misplaced word, and the same on every device and for views and copies."""

import pytest
import torch

from rlx.sync.checksum import tensor_checksum


def test_equal_bytes_give_equal_checksums_across_views_and_copies():
    t = torch.randn(1000, 33)
    assert tensor_checksum(t) == tensor_checksum(t.clone()) == tensor_checksum(t.T.contiguous().T.contiguous())
    assert tensor_checksum(t[:, :5]) == tensor_checksum(t[:, :5].contiguous())
    assert tensor_checksum(torch.zeros(7, dtype=torch.bfloat16)) != tensor_checksum(
        torch.zeros(8, dtype=torch.bfloat16)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_any_changed_swapped_or_missing_word_changes_the_checksum(dtype):
    t = (torch.randn(4099) * 100).to(dtype)
    base = tensor_checksum(t)
    flipped = t.clone().view(torch.uint8)
    flipped[1234] ^= 1
    swapped = t.clone()
    swapped[[10, 2000]] = swapped[[2000, 10]]
    assert tensor_checksum(flipped.view(dtype)) != base
    assert swapped[10] == swapped[2000] or tensor_checksum(swapped) != base
    assert tensor_checksum(t[:-1]) != base
    assert tensor_checksum(torch.zeros_like(t)) != tensor_checksum(torch.zeros(t.numel() + 1, dtype=dtype))


@pytest.mark.gpu
def test_cpu_and_gpu_agree():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    t = torch.randn(3, 1 << 20).to(torch.bfloat16)
    assert tensor_checksum(t) == tensor_checksum(t.cuda())
