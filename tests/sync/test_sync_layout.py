import pytest
import torch

from rlx.sync.dtypes import dtype_name
from rlx.sync.layout import ALIGN_BYTES, TensorSpec, align_up, pack_buckets

SLOT = 64 * 1024


def spec(name, nbytes, dtype="uint8"):
    return TensorSpec(name, dtype, [nbytes], nbytes)


def sizes_mix():
    # small, odd, exactly a slot, larger than a slot (split), empty, then small again
    return [
        spec("a", 10),
        spec("b", 1001),
        spec("c", SLOT),
        spec("big", 3 * SLOT + 77),
        spec("empty", 0),
        spec("d", SLOT - 5),
        spec("e", 300),
        spec("f", 2 * SLOT),
    ]


def test_offsets_aligned_in_bounds_and_disjoint():
    buckets = list(pack_buckets(sizes_mix(), SLOT))
    for bucket in buckets:
        ranges = sorted((c.offset, c.offset + c.nbytes) for c in bucket.chunks)
        for start, end in ranges:
            assert start % ALIGN_BYTES == 0
            assert 0 <= start <= end <= SLOT
        for (_, end), (next_start, _) in zip(ranges, ranges[1:], strict=False):
            assert end <= next_start, f"overlap in bucket: {ranges}"


def test_every_byte_placed_once_in_order_and_only_last_is_last():
    specs = sizes_mix()
    buckets = list(pack_buckets(specs, SLOT))
    assert [b.is_last for b in buckets] == [False] * (len(buckets) - 1) + [True]
    covered: dict[str, int] = {}
    order = []
    for bucket in buckets:
        for c in bucket.chunks:
            assert c.chunk_start == covered.get(c.name, 0), "chunks of a split tensor must arrive in order"
            covered[c.name] = c.chunk_start + c.nbytes
            if not order or order[-1] != c.name:
                order.append(c.name)
    assert covered == {s.name: s.nbytes for s in specs}
    assert order == [s.name for s in specs]


def test_only_tensors_larger_than_a_slot_are_split():
    buckets = list(pack_buckets(sizes_mix(), SLOT))
    split = {c.name for b in buckets for c in b.chunks if c.nbytes != c.total_nbytes}
    assert split == {"big", "f"}
    big = [c for b in buckets for c in b.chunks if c.name == "big"]
    assert [c.nbytes for c in big] == [SLOT, SLOT, SLOT, 77]


def test_split_tensor_reassembles_bit_exactly_through_slots():
    torch.manual_seed(0)
    tensors = {
        "w": torch.randn(3 * SLOT // 4 + 13, dtype=torch.float32),
        "b": torch.randn(7, dtype=torch.bfloat16),
        "h": torch.randn(40_000, dtype=torch.float16),
    }
    specs = [
        TensorSpec(n, dtype_name(t.dtype), list(t.shape), t.numel() * t.element_size()) for n, t in tensors.items()
    ]
    slot = torch.empty(SLOT, dtype=torch.uint8)
    rebuilt = {n: torch.empty_like(t) for n, t in tensors.items()}
    for bucket in pack_buckets(specs, SLOT):
        slot.fill_(0xAB)  # whatever a previous bucket left must not leak through
        for c in bucket.chunks:
            src = tensors[c.name].view(-1).view(torch.uint8)
            slot[c.offset : c.offset + c.nbytes].copy_(src[c.chunk_start : c.chunk_start + c.nbytes])
        for c in bucket.chunks:
            dst = rebuilt[c.name].view(-1).view(torch.uint8)
            dst[c.chunk_start : c.chunk_start + c.nbytes].copy_(slot[c.offset : c.offset + c.nbytes])
    for name, t in tensors.items():
        assert torch.equal(rebuilt[name].view(torch.uint8), t.view(torch.uint8)), name


def test_empty_input_and_bad_slot_size():
    assert list(pack_buckets([], SLOT)) == []
    with pytest.raises(ValueError, match="multiple of 256"):
        list(pack_buckets([spec("a", 1)], 1000))
    assert align_up(1) == ALIGN_BYTES and align_up(ALIGN_BYTES) == ALIGN_BYTES and align_up(0) == 0
