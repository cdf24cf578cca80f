"""copy_bytes: memmove for contiguous CPU tensors, copy_ (with its checks) for everything else."""

import pytest
import torch

from rlx.sync.copy import copy_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.uint8])
def test_contiguous_cpu_copy_is_exact(dtype):
    src = (torch.randn(1000, 37) * 50).to(dtype)
    dst = torch.zeros_like(src)
    copy_bytes(dst, src)
    assert torch.equal(dst, src)
    assert dst.data_ptr() != src.data_ptr()


def test_slices_of_a_flat_buffer():
    buffer = torch.zeros(4096, dtype=torch.uint8)
    src = torch.arange(256, dtype=torch.uint8)
    copy_bytes(buffer[1024:1280], src)
    assert torch.equal(buffer[1024:1280], src)
    assert int(buffer[:1024].sum()) == 0 and int(buffer[1280:].sum()) == 0


def test_strided_source_goes_through_copy_():
    src = torch.arange(64, dtype=torch.float32).reshape(8, 8).t()  # not contiguous
    dst = torch.empty(8, 8)
    copy_bytes(dst, src)
    assert torch.equal(dst, src)


def test_shape_mismatch_is_refused_not_memmoved():
    # copy_ cannot broadcast 6 into 4 elements; a raw memmove would silently overrun
    with pytest.raises(RuntimeError):
        copy_bytes(torch.empty(4), torch.ones(6))


def test_empty_tensors():
    copy_bytes(torch.empty(0), torch.empty(0))
