"""The trainer ranks' data plane: rank 0 puts a step's rows into the store, the others pull their share.

With ``trainer.data_plane=store`` and several ranks, rank 0 (the controller) puts the step's samples
into the sample store and broadcasts one fixed-size ``BatchNotice`` frame (the store's
handle, the first row and the row count, the batch's padded widths) after the rank bus's TRAIN
command. Each other rank reads the rows' table entries (lengths, rewards, loss-token counts: a few
numbers per row, from the store, not from rank 0), computes the same micro-batch plan as every
rank (``rlx.trainer.packing``), and reads from the store only the rows its plan gives it. What rank
0 sends per step is therefore the same number of bytes whatever the batch's size or token count.

``StoredBatch`` is the batch a pulling rank hands to ``Trainer.step``: the per-row counts are real
(the attention mask rebuilt from the lengths, the loss mask's row sums, the rewards), and ``rows``
reads the asked-for rows from the store, so the trainer's plan and losses are those of the full
batch. The other token tensors are zero-stride placeholders that the trainer never reads.

Rows are laid out by ``rlx.trainer.batch.collate`` at the whole batch's widths (prompts left-padded,
completions right-padded, the same pad id), so a rank's rows are the bytes that ``broadcast_batch``
would have sent it.
"""

from __future__ import annotations

import msgspec
import torch
import torch.distributed as dist

from rlx.config.store import StoreConfig
from rlx.store.base import Sample, SampleStore, StoreHandle, StoreReader, create_store, open_reader
from rlx.trainer.batch import TrainBatch, collate

NOTICE_BYTES = 256  # one frame per step whatever the batch: the handle, a row range and three widths


class BatchNotice(msgspec.Struct, array_like=True):
    handle: StoreHandle
    first_row: int
    num_rows: int
    prompt_len: int
    completion_len: int
    pad_id: int


class StoredBatch(TrainBatch):
    """A step batch whose rows stay in the store until ``rows`` asks for them (see the module docstring)."""

    @classmethod
    def open(cls, reader: StoreReader, notice: BatchNotice) -> StoredBatch:
        ids = list(range(notice.first_row, notice.first_row + notice.num_rows))
        meta = reader.meta(ids)
        p, t, b = notice.prompt_len, notice.completion_len, notice.num_rows
        columns = torch.arange(p + t)
        prompt = torch.from_numpy(meta["prompt_len"].copy()).unsqueeze(1)
        completion = torch.from_numpy(meta["completion_len"].copy()).unsqueeze(1)
        attention = ((columns >= p - prompt) & (columns < p + completion)).long()
        loss_tokens = torch.from_numpy(meta["loss_tokens"].copy()).unsqueeze(1)
        mask = (torch.arange(t) < loss_tokens).float()  # only its row sums are read
        rewards = torch.from_numpy(meta["reward"].astype("float32"))
        unread = torch.zeros((), dtype=torch.long).expand(b, p + t)
        logp = torch.zeros((), dtype=torch.float32).expand(b, t)
        batch = cls(unread, attention, unread, unread[:, :t], mask, logp, rewards)
        batch._reader, batch._notice = reader, notice
        return batch

    def rows(self, index) -> TrainBatch:
        n = self._notice
        rows = torch.arange(n.num_rows)[index].tolist()
        samples = self._reader.get([n.first_row + i for i in rows])
        return collate(samples, n.pad_id, n.prompt_len, n.completion_len)


class DataPlane:
    """Rank 0's side: ``send`` before its train step, ``done`` after it."""

    def __init__(self, store_cfg: StoreConfig, pad_id: int, device: torch.device) -> None:
        self.store: SampleStore = create_store(
            store_cfg.transport, store_cfg.capacity_mb, store_cfg.max_rows, store_cfg.timeout_s
        )
        self.pad_id, self.device = pad_id, device
        self._rows: list[int] = []

    def send(self, samples: list[Sample], batch: TrainBatch) -> int:
        """Put ``samples`` (``batch`` is their ``collate``) and broadcast their notice; the bytes broadcast (the same
        every step)."""
        self._rows = self.store.put(samples)
        completion_len = batch.completion_ids.shape[1]
        notice = BatchNotice(
            self.store.handle(),
            self._rows[0],
            len(self._rows),
            batch.input_ids.shape[1] - completion_len,
            completion_len,
            self.pad_id,
        )
        return broadcast_notice(notice, self.device)

    def done(self) -> dict[str, float]:
        """Release the step's rows (every rank has read them: the step's collectives are behind) and
        the store's metrics."""
        stats = self.store.stats()
        self.store.release(self._rows)
        self._rows = []
        return stats

    def close(self) -> None:
        self.store.close()


def broadcast_notice(notice: BatchNotice | None, device: torch.device) -> int:
    frame = torch.zeros(NOTICE_BYTES, dtype=torch.uint8)
    if notice is not None:
        encoded = msgspec.msgpack.encode(notice)
        if len(encoded) + 2 > NOTICE_BYTES:
            raise ValueError(f"a batch notice of {len(encoded)} bytes does not fit the {NOTICE_BYTES}-byte frame")
        frame[:2] = torch.tensor([len(encoded) >> 8, len(encoded) & 0xFF], dtype=torch.uint8)
        frame[2 : 2 + len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    frame = frame.to(device)
    dist.broadcast(frame, 0)
    return NOTICE_BYTES


class Puller:
    """A rank other than 0: the step batch it trains on, from the notice rank 0 broadcasts."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._readers: dict[tuple[str, str], StoreReader] = {}

    def receive(self) -> StoredBatch:
        frame = torch.zeros(NOTICE_BYTES, dtype=torch.uint8, device=self.device)
        dist.broadcast(frame, 0)
        frame = frame.cpu()
        length = (int(frame[0]) << 8) | int(frame[1])
        notice = msgspec.msgpack.decode(bytes(frame[2 : 2 + length].numpy()), type=BatchNotice)
        key = (notice.handle.kind, notice.handle.name)
        if key not in self._readers:
            try:
                self._readers[key] = open_reader(notice.handle)
            except FileNotFoundError as exc:
                raise RuntimeError(
                    f"trainer rank {dist.get_rank()} cannot open rank 0's sample store ({exc}); the "
                    "shm store needs every trainer rank on rank 0's host: set "
                    "store.transport=tcp when the ranks span hosts"
                ) from None
        return StoredBatch.open(self._readers[key], notice)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
