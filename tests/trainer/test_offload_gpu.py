"""The colocated offload through its pinned buffer: every parameter, gradient and optimizer state leaves the GPU
and comes back bit for bit, the GPU memory is handed back meanwhile, and a buffer too large to pin falls back to
per-tensor copies with the same result. Each turn measures the allocation it starts from: the copies a turn
compares against stay on the GPU until it ends (the first H200 run of this test measured once, before two turns,
and counted the first turn's copies against the second's offload, as if it freed nothing)."""

from __future__ import annotations

import pytest
import torch

from rlx.trainer import offload

pytestmark = pytest.mark.gpu


def _trained(device: torch.device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)
    model[0].weight.data = model[0].weight.data.t().contiguous().t()  # a non-contiguous parameter
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 64, device=device)).square().mean().backward()
    optimizer.step()
    return model, optimizer


def _state(model, optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()] + [p.grad.clone() for p in model.parameters()]
    for state in optimizer.state.values():
        tensors += [v.clone() for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return tensors


@pytest.mark.parametrize("pin_fraction", [offload.PIN_FRACTION, 0.0])
def test_offload_and_onload_round_trip_every_tensor(pin_fraction, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(offload, "PIN_FRACTION", pin_fraction)
    device = torch.device("cuda", 0)
    model, optimizer = _trained(device)
    before = _state(model, optimizer)
    mover = offload.Offloader([model], optimizer, device)
    for _ in range(2):  # the second turn reuses the buffer
        allocated = torch.cuda.memory_allocated(device)
        moved = mover.offload()
        assert moved == sum(t.nbytes for t in before)
        assert mover.pinned is (pin_fraction > 0)
        held = _state(model, optimizer)
        assert all(t.device.type == "cpu" for t in held)
        if mover.pinned:
            assert all(p.data.is_pinned() for p in model.parameters())
        assert torch.cuda.memory_allocated(device) < allocated - moved // 2
        assert mover.onload() == moved
        after = _state(model, optimizer)
        assert all(t.device == device for t in after)
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        del after  # its copies on the GPU would be counted in the next turn's allocation
    model(torch.randn(8, 64, device=device)).square().mean().backward()
    optimizer.step()  # the optimizer still holds the parameters it steps
