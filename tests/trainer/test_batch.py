"""A step's samples become the trainer's padded batch in one place (``collate``): the layout every rank
and every data plane agrees on."""

import torch

from rlx.store.base import Sample
from rlx.store.shm import ShmStore
from rlx.trainer.batch import collate


def samples() -> list[Sample]:
    return [
        Sample.of([5, 6], [7, 8, 9], [-0.5, -0.25, -1.0], 1.0),
        Sample.of([4], [3], [-2.0], 0.0, loss_mask=[0.0], versions=[2]),
        Sample.of([1, 2, 3], [], [], 0.5),
    ]


def test_prompts_sit_left_of_their_completions_and_padding_is_masked_out():
    batch = collate(samples(), pad_id=0)
    assert batch.input_ids.tolist() == [[0, 5, 6, 7, 8, 9], [0, 0, 4, 3, 0, 0], [1, 2, 3, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 0, 1, 2, 3, 4], [0, 0, 0, 1, 1, 1], [0, 1, 2, 2, 2, 2]]
    assert batch.completion_ids.tolist() == [[7, 8, 9], [3, 0, 0], [0, 0, 0]]
    assert batch.mask.tolist() == [[1, 1, 1], [0, 0, 0], [0, 0, 0]]  # the second's one token is masked by its sample
    assert batch.rollout_logp.tolist() == [[-0.5, -0.25, -1.0], [-2.0, 0, 0], [0, 0, 0]]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]


def test_rows_read_back_from_the_store_at_the_batch_widths_are_the_batch_rows():
    """What a rank pulling its share from the sample store trains on: the same bytes as rank 0's rows."""
    full = collate(samples(), pad_id=0)
    store = ShmStore(1 << 16, 8)
    try:
        rows = store.put(samples())
        part = collate(
            store.get([rows[1], rows[2]]),
            0,
            full.input_ids.shape[1] - full.completion_ids.shape[1],
            full.completion_ids.shape[1],
        )
        expected = full.rows(torch.tensor([1, 2]))
        for name in (
            "input_ids",
            "attention_mask",
            "position_ids",
            "completion_ids",
            "mask",
            "rollout_logp",
            "rewards",
        ):
            assert torch.equal(getattr(part, name), getattr(expected, name)), name
    finally:
        store.close()
