"""Two trainer steps at rank RANK of WORLD_SIZE, once with the batch broadcast, once pulled from the store.

Rank 0 trains through its ``RankGroup`` as the controller does (the command, then the store notice or
the batch broadcast); the other ranks run the real ``rlx.trainer.ranks.follow``. Every rank prints one RESULT
line (JSON) per data plane; each plane starts from a freshly loaded model. Used by test_data_plane.py through real
processes (gloo). Not a test module itself.
"""

import json
import sys

import torch

from rlx.config.roles import trainer_role


def batches():
    """Two steps' samples."""
    from rlx.store.base import Sample

    generator = torch.Generator().manual_seed(123)
    out = []
    for rows, longest in ((12, 5), (24, 40)):  # the second: twice the rows, much longer completions
        samples = []
        for i in range(rows):
            prompt = torch.randint(4, 40, (2 + i % 3,), generator=generator).tolist()
            completion = torch.randint(4, 40, (1 + (i * 7) % longest,), generator=generator).tolist()
            samples.append(
                Sample.of(prompt, completion, [-1.0 - 0.1 * j for j in range(len(completion))], float((i * 5) % 3 == 0))
            )
        out.append(samples)
    return out


def main(model_dir: str, output_dir: str) -> None:
    import torch.distributed as dist

    from rlx.config.model import ModelConfig
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.ranks import init_distributed

    init_distributed("cpu")
    torch.manual_seed(0)
    results = {}
    for plane in ("broadcast", "store", "store_tcp"):  # store_tcp: store.transport=tcp
        torch.manual_seed(0)
        cfg = RunConfig(
            model=ModelConfig(path=model_dir),
            trainer=TrainerConfig(
                micro_batch_size=3,
                micro_batch_tokens=64,
                lr=1e-3,
                num_ranks=2,
                data_plane=plane.split("_")[0],
                output_dir=output_dir,
            ),
        )
        cfg.rollout.n = 4
        cfg.store.transport = "tcp" if plane == "store_tcp" else "shm"
        results[plane] = lead(cfg) if dist.get_rank() == 0 else follow_recording(cfg)
    print("RESULT" + json.dumps(results), flush=True)
    dist.destroy_process_group()


def lead(cfg) -> dict:
    from rlx.trainer.batch import collate
    from rlx.trainer.packing import plan_packed
    from rlx.trainer.ranks import RankGroup
    from rlx.trainer.trainer import Trainer

    group = RankGroup(trainer_role(cfg), Trainer(trainer_role(cfg)), pad_id=0)
    store = group.plane.store if group.plane is not None else None
    losses, control_bytes, plans, store_stats = [], [], [], []
    for samples in batches():
        sent = group.bytes_sent
        metrics = group.train(samples)
        losses.append(metrics["loss"])
        if store is not None:
            store_stats.append({k: v for k, v in metrics.items() if k.startswith("store_")})
        control_bytes.append(group.bytes_sent - sent)
        assert metrics["rank_bus_bytes"] == control_bytes[-1]
        lengths = collate(samples, 0).attention_mask.sum(dim=1).tolist()
        plans.append([sorted(r for mb in rank for r in mb) for rank in plan_packed(lengths, 2, 64)])
    served, kind = getattr(store, "requests_served", 0), store.handle().kind if store else ""
    group.stop()
    return {
        "loss": losses,
        "control_bytes": control_bytes,
        "plans": plans,
        "store": store_stats,
        "handle_kind": kind,
        "requests_served": served,
    }


def follow_recording(cfg) -> dict:
    from rlx.trainer.plane import StoredBatch
    from rlx.trainer.ranks import follow

    fetched: list[list[int]] = []
    rows = StoredBatch.rows

    def recording(self, index):
        if not fetched or fetched[-1][0] != self._notice.first_row:
            fetched.append([self._notice.first_row])
        fetched[-1].extend(torch.arange(self._notice.num_rows)[index].tolist())
        return rows(self, index)

    StoredBatch.rows = recording
    follow(trainer_role(cfg))
    return {"fetched": [sorted(set(f[1:])) for f in fetched]}


if __name__ == "__main__":
    main(*sys.argv[1:])
