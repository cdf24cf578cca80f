"""Per-tensor checksums of a tensor's raw bytes (dtype and values, bit for bit), computed where it lies.

Used by ``verify`` syncs: the sender checksums each source tensor, the receiver checksums what it loaded,
and the sender compares. The bytes are read as 32-bit words w_i and hashed as sum((w_i + K) * (2i + 1))
modulo 2**64, xor the byte count: a stale, torn, misplaced or swapped word changes it, and it runs on the
tensor's own device (a GPU checks a gigabyte in milliseconds; the CRC of a copy to the CPU took ~1 s per
GB). Integer sums modulo 2**64 do not depend on the order of the additions, so CPU and GPU, sender and
receiver, agree bit for bit. It is not a defence against a malicious peer.
"""

from __future__ import annotations

import torch

_K = 0x9E3779B1  # keeps zero words from vanishing from the sum
_CHUNK_WORDS = 1 << 26  # 256 MiB of words at a time: bounded scratch memory
_MASK = (1 << 64) - 1


def tensor_checksum(t: torch.Tensor) -> int:
    raw = t.detach().reshape(-1).contiguous().view(torch.uint8)
    nbytes = raw.numel()
    if nbytes % 4:
        raw = torch.cat([raw, raw.new_zeros(4 - nbytes % 4)])
    words = raw.view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS].to(torch.int64)
        odd = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=words.device) * 2 + 1
        total += ((chunk + _K) * odd).sum()
    return (int(total) & _MASK) ^ nbytes
