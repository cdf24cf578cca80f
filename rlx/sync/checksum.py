"""Per-tensor checksums: CRC-32 of a tensor's raw bytes (dtype and values, bit for bit).

Used by ``verify`` syncs: the sender checksums each source tensor, the receiver checksums what it
loaded, and the sender compares. CRC-32 (zlib, which releases the GIL) is enough to catch
stale, torn or misplaced bytes; it is not a defence against a malicious peer. CUDA tensors are
copied to the CPU first, which is slow but only paid when verification is on.
"""

from __future__ import annotations

import zlib

import torch


def tensor_checksum(t: torch.Tensor) -> int:
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    raw = flat.contiguous().view(torch.uint8).numpy()
    return zlib.crc32(raw)
