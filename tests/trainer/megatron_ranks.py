"""trainer.backend=megatron at rank RANK of WORLD_SIZE=2 (gloo); rank 0 writes what it saw into OUT_DIR.

Used by test_megatron_ranks.py through real processes (one launch for every layout: megatron's parallel state is
built again for each). Not a test module itself.

    megatron_ranks.py TIED UNTIED OUT_DIR

- tp.safetensors / tp.json: TP=2 on TIED: logprobs and entropy of a fixed batch, then one update's weights, metrics;
  and whether a torch_dist checkpoint of that step, loaded by a new trainer, gives back the same weights
- dp.safetensors / dp.json: TP=1 on UNTIED over two data-parallel ranks: the same
- pp.safetensors / pp.json: PP=2 on UNTIED: the sync's tensors gathered from both stages; then megatron-core's
  pipeline schedule on one micro-batch, and TIED's build under two stages, each with the error it stops with
"""

import json
import sys
import traceback
from pathlib import Path

import torch
from safetensors.torch import save_file


def trainer(model_dir: str, tp: int):
    from rlx.config.megatron import MegatronConfig
    from rlx.config.model import ModelConfig
    from rlx.config.roles import trainer_role
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.trainer import Trainer
    from tests.trainer.test_megatron import LR

    torch.manual_seed(0)
    cfg = RunConfig(
        model=ModelConfig(path=model_dir),
        trainer=TrainerConfig(
            device="cpu",
            backend="megatron",
            num_ranks=2,
            lr=LR,
            micro_batch_size=4,
            micro_batch_tokens=0,
            megatron=MegatronConfig(tensor_parallel=tp),
        ),
    )
    cfg.rollout.n = 4
    return Trainer(trainer_role(cfg))


def step(model_dir: str, out: str, tp: int, checkpoint: bool = False) -> None:
    from rlx.trainer.packing import micro_batches
    from tests.trainer.test_trainer_step import ragged_batch

    t = trainer(model_dir, tp)
    batch = ragged_batch()
    (mb,) = micro_batches(batch, 0, 1, 0, batch.size)  # every rank scores the whole batch
    with torch.no_grad():
        logp, entropy = t._logprobs(t.model, mb)
    metrics = t.step(batch)
    weights = {name: tensor.contiguous().clone() for name, tensor in t.named_tensors()}
    report = {k: metrics[k] for k in ("loss", "grad_norm")}
    if checkpoint:
        report["resumed_equal"] = resumed_equal(t, model_dir, tp, Path(out).parent / "ckpt", weights)
    if torch.distributed.get_rank() == 0:
        save_file({"logp": logp, "entropy": entropy, **{f"w.{k}": v for k, v in weights.items()}}, out)
        Path(out).with_suffix(".json").write_text(json.dumps(report))


def resumed_equal(t, model_dir: str, tp: int, root: Path, weights: dict) -> bool:
    """Save ``t`` in torch_dist on both ranks, load it into a new trainer: the same weights, bit for bit?"""
    from rlx.trainer.megatron.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(root, 1, t.model, t.optimizer, t.scheduler, model_dir, {"step": 1}, keep=1)
    torch.distributed.barrier()
    fresh = trainer(model_dir, tp)
    load_checkpoint(next(root.glob("step_*")), fresh.model, fresh.optimizer, fresh.scheduler)
    return all(torch.equal(tensor, weights[name]) for name, tensor in fresh.named_tensors())


def _error(exc: BaseException) -> dict:
    """The exception and the last line of megatron-core it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    frame = next((f for f in reversed(frames) if "megatron" in f.filename), frames[-1])
    where = f"{Path(frame.filename).name}:{frame.lineno} {frame.name}: {frame.line}"
    return {"type": type(exc).__name__, "message": str(exc), "where": where}


def pipeline(model_dir: str, tied_dir: str, out: str) -> None:
    from rlx.config.megatron import MegatronConfig
    from rlx.config.model import ModelConfig
    from rlx.config.roles import trainer_role
    from rlx.config.schema import RunConfig
    from rlx.config.trainer import TrainerConfig
    from rlx.trainer.megatron.policy import MegatronPolicy

    def policy(path: str) -> MegatronPolicy:
        megatron = MegatronConfig(pipeline_parallel=2)
        cfg = RunConfig(model=ModelConfig(path=path), trainer=TrainerConfig(backend="megatron", megatron=megatron))
        return MegatronPolicy(trainer_role(cfg), torch.device("cpu"))

    staged = policy(model_dir)
    weights = {name: tensor.contiguous() for name, tensor in staged.named_tensors()}
    report = {"stage_layers": len(staged.module.decoder.layers), "schedule": schedule_error(staged)}
    try:
        policy(tied_dir)
        report["tied"] = None
    except Exception as exc:  # noqa: BLE001 - reported to the test, which names it
        report["tied"] = _error(exc)
    if torch.distributed.get_rank() == 0:
        save_file(weights, out)
        Path(out).with_suffix(".json").write_text(json.dumps(report))


def schedule_error(staged) -> dict | None:
    """megatron-core's own pipeline schedule, forward and backward of one micro-batch over the two stages."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from rlx.trainer.megatron.logprobs import final_hidden, left_aligned
    from rlx.trainer.megatron.parallel import cpu_forward
    from rlx.trainer.packing import micro_batches
    from tests.trainer.test_trainer_step import ragged_batch

    (mb,) = micro_batches(ragged_batch(), 0, 1, 0, 12)
    aligned, rows, columns = left_aligned(mb.batch)

    def forward_step(_data, model):
        return final_hidden(model, aligned), lambda hidden: (hidden[columns, rows].sum(), {})

    try:
        with cpu_forward(torch.device("cpu")):
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter([None]),
                model=[staged.module],
                num_microbatches=1,
                seq_length=aligned.shape[1],
                micro_batch_size=aligned.shape[0],
            )
    except Exception as exc:  # noqa: BLE001 - reported to the test, which names it
        return _error(exc)
    return None


def main() -> None:
    from rlx.trainer.ranks import init_distributed

    torch.set_num_threads(1)
    init_distributed("cpu")
    tied, untied, out = sys.argv[1:]
    step(tied, f"{out}/tp.safetensors", tp=2, checkpoint=True)
    step(untied, f"{out}/dp.safetensors", tp=1)
    pipeline(untied, tied, f"{out}/pp.safetensors")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
