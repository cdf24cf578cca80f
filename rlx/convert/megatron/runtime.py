"""megatron-core on a CPU, in one process: the process group, the model skeleton, save and load.

- ``single_process_group()``: torch.distributed (gloo, world size 1, in-process HashStore, no
  port) and megatron's parallel state with TP = PP = 1, torn down afterwards if we set it up.
- ``build_gpt_model(spec)``: megatron-core's GPTModel (local layer spec) on the meta device,
  so its ``sharded_state_dict()`` gives the exact keys, shapes and layer offsets a torch_dist
  checkpoint of this model has, without allocating any weights.
- ``save_torch_dist``: megatron's torch_dist save with a writer that stays on the CPU (the stock
  one synchronises CUDA before and after writing).
- ``load_tensors``: megatron's load of a subset of tensors, which never reads ``common.pt``
  (pickled objects; not needed for weights) and first checks ``.metadata``.

About pickle: PyTorch's distributed-checkpoint format stores its ``.metadata`` file as a pickle
and ``common.pt`` with ``torch.save``. rlx writes only plain dicts of numbers into ``common.pt``
(it loads with ``weights_only=True``) and, before megatron unpickles ``.metadata``, replays it
with an unpickler that accepts only the classes of torch.distributed.checkpoint's metadata;
anything else is refused.

Left out: tensor and pipeline parallel layouts beyond what torch_dist already makes TP/PP-free,
and megatron's forward pass (conversion needs none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from rlx.convert.errors import ConvertError
from rlx.convert.megatron.spec import ModelSpec

CHECKPOINT_VERSION = 3.0
# Data classes and enums that torch.distributed.checkpoint pickles into .metadata.
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner")
_SAFE_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata"),
    ("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan"),
}


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """Also silences megatron's warnings about missing GPU-only packages (Transformer Engine, Apex)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.distributed as dist
        from megatron.core import parallel_state

        created = not dist.is_initialized()
        if created:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            if created:
                parallel_state.destroy_model_parallel()
                dist.destroy_process_group()


def architecture(spec: ModelSpec) -> dict:
    """The TransformerConfig fields that say what model ``spec`` is (shape, norms, gated SiLU MLP, biases):
    the same for the converter's skeleton and the trainer's megatron backend."""
    import torch.nn.functional as F

    return {
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_query_groups": spec.num_kv_heads,
        "kv_channels": spec.head_dim,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": spec.norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": spec.qkv_bias,
        "qk_layernorm": spec.qk_norm,
    }


def build_gpt_model(spec: ModelSpec, dtype: torch.dtype, device: str = "meta"):
    """megatron-core GPTModel for ``spec``; on the meta device (the default) it allocates nothing."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(
        **architecture(spec),
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=dtype,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
    )
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=spec.qk_norm, normalization="RMSNorm")
    with torch.device(device):
        return GPTModel(
            config,
            layer_spec,
            vocab_size=spec.padded_vocab_size,
            max_sequence_length=spec.max_position_embeddings,
            position_embedding_type="rope",
            rotary_base=int(spec.rope_theta),
            share_embeddings_and_output_weights=spec.tie_word_embeddings,
        )


def save_torch_dist(sharded_state_dict: dict, iter_dir: Path, iteration: int) -> None:
    """Write a torch_dist checkpoint (metadata.json, common.pt, .metadata, __0_*.distcp)."""
    from megatron.core import dist_checkpointing

    state = {"model": sharded_state_dict, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
    dist_checkpointing.save(state, str(iter_dir), sharded_strategy=cpu_save_strategy())


def cpu_save_strategy():
    """megatron's torch_dist save minus the CUDA synchronisation around the write; on several ranks the
    coordinator, which gathers the write results, checks them and writes the metadata."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint.utils import _get_failure_dict

    class CpuTorchDistSave(TorchDistSaveShardedStrategy):
        """The stock strategy, minus the CUDA synchronisation around the write (tensors are on the CPU)."""

        def _get_save_and_finalize_callbacks(self, writer, save_state_dict_ret) -> AsyncRequest:
            save_fn, _cuda_preload, save_args = writer.get_save_function_and_args()
            _, global_metadata, dist_wrapper = save_state_dict_ret

            def finalize() -> None:
                results = dist_wrapper.gather_object(writer.retrieve_write_results())
                if results is None:  # not the coordinator: it checks and writes the metadata
                    return
                failures = _get_failure_dict(results)
                if failures:
                    raise CheckpointException("write", failures)
                writer.finish(global_metadata, results)

            return AsyncRequest(save_fn, save_args, [finalize])

    return CpuTorchDistSave("torch_dist", 1)


def load_tensors(sharded_tensors: dict, iter_dir: Path) -> dict[str, torch.Tensor]:
    """Load the given ShardedTensors from ``iter_dir`` (their ``data`` is filled in)."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load(
        sharded_tensors, str(iter_dir), common_strategy=_no_common_strategy(), validate_access_integrity=False
    )


def tensors_metadata(iter_dir: Path) -> dict:
    """{key: ShardedTensor without data} for every tensor of the checkpoint (global shapes, dtypes)."""
    check_metadata_file(iter_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import dist_checkpointing

        return dist_checkpointing.load_tensors_metadata(str(iter_dir))


def _no_common_strategy():
    from megatron.core.dist_checkpointing.strategies.base import LoadCommonStrategy

    class NoCommon(LoadCommonStrategy):
        """Weights only: never opens common.pt (optimizer/args objects, not needed here)."""

        def load_common(self, checkpoint_dir):
            return {}

        def load_sharded_objects(self, sharded_objects_state_dict, checkpoint_dir):
            raise ConvertError("rlx loads only tensors from torch_dist checkpoints")

        def check_backend_compatibility(self, loaded_version):
            pass

        def check_version_compatibility(self, loaded_version):
            pass

    return NoCommon()


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        if module in _METADATA_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of checkpoint metadata")


def check_metadata_file(iter_dir: Path) -> None:
    """Refuse a ``.metadata`` that references anything besides distributed-checkpoint metadata."""
    path = Path(iter_dir) / ".metadata"
    if not path.is_file():
        raise ConvertError(
            f"{iter_dir} has no .metadata; it is not a complete torch_dist checkpoint (the save was interrupted?)"
        )
    try:
        with open(path, "rb") as f:
            _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as exc:
        raise ConvertError(
            f"{path} was refused: {exc}. A torch_dist .metadata holds only checkpoint "
            "metadata; this one is corrupt or was crafted — do not load it"
        ) from None
