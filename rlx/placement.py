"""Which GPUs each process of `rlx train` gets, and how much of a GPU each engine may take.

``plan(cfg, num_gpus)`` is a pure function of the run config and the number of GPUs the launcher sees:
one ``Slot`` per child -- trainer ranks first, then the launched rollout servers -- holding the indices
(into the launcher's visible GPUs) of its devices and, for a server, its engine's memory fraction. The
embedded launcher turns a slot into the child's ``CUDA_VISIBLE_DEVICES`` and config overrides
(``Slot.env``, ``Slot.overrides``); a Ray launcher can hand the same slots to its actors.

Layouts (``placement.mode``):

- ``separate``: trainer rank r on GPU r; server i on the ``rollout.tensor_parallel_size`` GPUs after the
  trainer's. An engine alone on its GPUs takes ``SEPARATE_FRACTION`` of each.
- ``colocated``: the servers' GPUs are the trainer's, taking turns: engines sleep
  (``placement.sleep_level``) while the trainer trains, the trainer offloads (``placement.offload``) while
  they generate (``rlx.orchestrator.colocation``). An engine then takes ``TURN_FRACTION`` of a GPU in its turn,
  ``SHARED_FRACTION`` when the trainer keeps its state there; several engines on one GPU split it.

Trainer rank 0 runs inside the launcher and uses the first visible GPU (``rlx.trainer.model.resolve_device``),
which is why trainer GPUs come first. On a host without GPUs (or ``trainer.device=cpu``) nothing is
assigned: children inherit the launcher's environment and the engine's memory setting is left as it is
(vLLM's CPU build reads it as a fraction of host memory). ``check`` raises a ``ConfigError`` naming the
fix before any process starts. It leaves out several hosts (Ray's placement groups do that), MIG slices
and GPUs of different sizes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError

if TYPE_CHECKING:
    from rlx.config.placement import PlacementConfig
    from rlx.config.roles import RolloutRole, TrainerRole
    from rlx.config.trainer import TrainerConfig

SEPARATE_FRACTION = 0.9
"""An engine alone on its GPU: vLLM's own default, room left for the CUDA context and the sampler."""
TURN_FRACTION = 0.8
"""Colocated, engines sleep and the trainer offloads: the whole GPU in the engines' turn, less what the
trainer keeps there (its CUDA context, the weight-sync buffers)."""
SHARED_FRACTION = 0.4
"""Colocated while the trainer keeps its parameters and optimizer state on the GPU."""
CPU_FRACTION = 0.2
"""vLLM's CPU build: the fraction of host memory for the KV cache when rollout.gpu_memory_utilization is unset."""


def visible_devices(indices, parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` showing a child the GPUs at ``indices`` of those this process sees: mapped through
    this process's own list (``parent_visible``), so a parent confined to GPUs 2,3 gives index 0 as GPU 2."""
    physical = [d.strip() for d in parent_visible.split(",") if d.strip()] if parent_visible else []
    return ",".join(physical[i] if physical else str(i) for i in indices)


@dataclass(frozen=True)
class Slot:
    name: str
    """The child's name: trainer<r> or rollout<i>."""
    devices: tuple[int, ...] = ()
    """Indices into the launcher's visible GPUs; () = inherit the launcher's environment (CPU host)."""
    memory_fraction: float | None = None
    """A server's engine memory fraction of each of its GPUs; None = leave rollout.gpu_memory_utilization."""
    peer_devices: tuple[int, ...] = ()
    """GPUs the child sees after its own without using them: the sending trainer rank's, so an engine on
    another GPU opens the trainer's CUDA IPC buffer peer-to-peer."""

    def env(self, parent_visible: str | None = None) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` for this child, mapped through the launcher's own (``parent_visible``)."""
        if not self.devices:
            return {}
        return {"CUDA_VISIBLE_DEVICES": visible_devices((*self.devices, *self.peer_devices), parent_visible)}

    def serving(self, role: RolloutRole) -> RolloutRole:
        """``role`` as the server in this slot runs it: with its share of the GPU's memory
        (rollout.gpu_memory_utilization), where the plan gave it one."""
        if self.memory_fraction is None:
            return role
        return replace(role, rollout=replace(role.rollout, gpu_memory_utilization=round(self.memory_fraction, 4)))


@dataclass(frozen=True)
class Plan:
    trainer: tuple[Slot, ...]
    rollout: tuple[Slot, ...]
    num_gpus: int
    sync_transport: str = "auto"
    """sync.transport made concrete for the launched servers on this host; as configured where it is left to
    the trainer (no GPU, or servers on other hosts)."""

    def server(self, index: int) -> Slot:
        return self.rollout[index] if index < len(self.rollout) else Slot(f"rollout{index}")

    def rank(self, rank: int) -> Slot:
        return self.trainer[rank] if rank < len(self.trainer) else Slot(f"trainer{rank}")

    def describe(self) -> str:
        """One line a user reads at start-up: which GPUs each child got."""
        if not self.num_gpus:
            return "placement: no GPU on this host; every process runs on the CPU"
        parts = [
            f"{s.name}: GPU {','.join(map(str, s.devices))}"
            + (f" ({s.memory_fraction:.2g} of memory)" if s.memory_fraction is not None else "")
            for s in (*self.trainer, *self.rollout)
        ]
        line = "placement: " + "; ".join(parts)
        if self.sync_transport == "cuda_ipc" and any(s.peer_devices for s in self.rollout):
            line += "; weights over CUDA IPC, peer-to-peer from the trainer's GPU"
        elif self.sync_transport == "nccl":
            line += "; weights over NCCL"
        return line


def uses_gpus(trainer: TrainerConfig, num_gpus: int) -> bool:
    return num_gpus > 0 and trainer.device != "cpu"


def rollout_gpus(servers: RolloutRole) -> int:
    return servers.placement.rollout_gpus or servers.rollout.servers_to_launch * servers.rollout.tensor_parallel_size


def check(servers: RolloutRole, trainer: TrainerConfig, num_gpus: int, peer_access=None) -> None:
    """Every layout mistake as one error naming the fix; nothing has been started. ``servers``: the rollout servers'
    view of the run (``rlx.config.roles``); ``peer_access`` as in ``plan``."""
    r, t, pl = servers.rollout, trainer, servers.placement
    if t.device == "cuda" and num_gpus == 0:
        raise ConfigError(
            "trainer.device=cuda but this host sees no GPU (CUDA_VISIBLE_DEVICES, driver); "
            "set trainer.device=auto or cpu"
        )
    if not uses_gpus(t, num_gpus):
        return
    tp, launched, wanted = r.tensor_parallel_size, r.servers_to_launch, rollout_gpus(servers)
    if wanted % tp:
        raise ConfigError(
            f"rollout.tensor_parallel_size={tp} does not divide placement.rollout_gpus={wanted}; "
            f"set placement.rollout_gpus to a multiple of {tp} or change the tensor parallel size"
        )
    if wanted // tp != launched:
        raise ConfigError(
            f"placement.rollout_gpus={wanted} with rollout.tensor_parallel_size={tp} makes "
            f"{wanted // tp} engines but rollout.num_servers={launched}; set rollout.num_servers="
            f"{wanted // tp} (one server per engine: data parallelism)"
        )
    reach = peer_access or _peer_access
    if servers.sync.transport == "cuda_ipc" and not all(reach(0, d) for d in range(1, num_gpus)):
        raise ConfigError(
            "sync.transport=cuda_ipc needs every engine to open the trainer's GPU memory, but the GPUs "
            "of this host cannot reach each other peer-to-peer; set sync.transport=auto (NCCL then)"
        )
    if pl.mode == "separate":
        need = t.num_ranks + wanted
        if need > num_gpus:
            raise ConfigError(
                f"placement.mode=separate needs {need} GPUs ({t.num_ranks} for trainer.num_ranks, {wanted} for "
                f"{launched} rollout server(s) x rollout.tensor_parallel_size={tp}) but this host sees {num_gpus}; "
                "lower trainer.num_ranks or rollout.num_servers, or set placement.mode=colocated"
            )
        return
    if t.num_ranks > num_gpus:
        raise ConfigError(
            f"trainer.num_ranks={t.num_ranks} needs one GPU per rank but this host sees {num_gpus}; "
            f"set trainer.num_ranks <= {num_gpus}"
        )
    if t.num_ranks % tp and wanted > tp:
        raise ConfigError(
            f"rollout.tensor_parallel_size={tp} does not divide the {t.num_ranks} colocated GPUs "
            f"(trainer.num_ranks); set the tensor parallel size to a divisor of {t.num_ranks}"
        )
    if tp > t.num_ranks:
        raise ConfigError(
            f"rollout.tensor_parallel_size={tp} spans more GPUs than the {t.num_ranks} colocated ones "
            f"(trainer.num_ranks); set trainer.num_ranks >= {tp} or placement.mode=separate"
        )
    per_gpu = _engines_per_gpu(r, t)
    if per_gpu > 1 and pl.sleep_level == 0:
        raise ConfigError(
            f"placement.mode=colocated puts {per_gpu} rollout servers on one GPU with "
            "placement.sleep_level=0: awake together beside the trainer they do not fit; set "
            "placement.sleep_level=1, or fewer rollout.num_servers"
        )


def choose_transport(kind: str, device: str, remote: bool = False, engines_see_sender: bool = True) -> str:
    """The one decision of ``sync.transport=auto`` (a named transport is kept): a broadcast (``nccl`` on a GPU,
    ``gloo`` on the CPU) where a receiver is on another host (``remote``) or cannot open the sender's GPU memory
    (``engines_see_sender``), else the device's shared memory (``cuda_ipc``, ``shm``), which every receiver reads
    in place. The launcher makes it for the engines it places (``plan``); the trainer's weight sender for the
    servers it reaches (``rlx.sync.factory``)."""
    if kind != "auto":
        return kind
    cuda = device.startswith("cuda")
    if remote or not engines_see_sender:
        return "nccl" if cuda else "gloo"
    return "cuda_ipc" if cuda else "shm"


def sync_transport(servers: RolloutRole, rollout: tuple[Slot, ...], peer_access) -> str:
    """``sync.transport`` for the engines launched on this GPU host (``choose_transport``): whether every one sees
    the sending rank's GPU (it shares it, or can reach it peer-to-peer: ``peer_access(a, b)``). Left as it is
    where servers beyond this host are in the run: the trainer's sender decides then, seeing all of them."""
    wanted = servers.sync.transport
    if wanted != "auto" or not rollout or servers.rollout.servers:
        return wanted
    sender = 0  # trainer rank 0 sends, from the first visible GPU
    if all(sender in s.devices or all(peer_access(sender, d) for d in s.devices) for s in rollout):
        return choose_transport(wanted, "cuda")
    if any(sender in s.devices for s in rollout):  # NCCL refuses two ranks of one group on one GPU
        raise ConfigError(
            "the engines on GPU 0 need CUDA IPC and the others NCCL (the GPUs of this host cannot "
            "reach each other peer-to-peer), and one sync uses one transport; set "
            "placement.mode=separate, or launch engines on GPU 0 only (rollout.num_servers)"
        )
    return choose_transport(wanted, "cuda", engines_see_sender=False)


def plan(servers: RolloutRole, trainer: TrainerConfig, num_gpus: int, peer_access=None) -> Plan:
    """The slot of every child; ``check(servers, trainer, num_gpus)`` must have passed. ``peer_access(a, b)``:
    whether GPU ``a``'s memory can be opened from GPU ``b`` (default: torch's answer on this host)."""
    t, r = trainer, servers.rollout
    launched = r.servers_to_launch
    if not uses_gpus(t, num_gpus):
        return Plan(
            tuple(Slot(f"trainer{i}") for i in range(t.num_ranks)),
            tuple(Slot(f"rollout{i}") for i in range(launched)),
            0,
            servers.sync.transport,
        )
    tp = r.tensor_parallel_size
    trainer = tuple(Slot(f"trainer{i}", (i,)) for i in range(t.num_ranks))
    if servers.placement.mode == "separate":
        first = t.num_ranks
        rollout = tuple(
            Slot(
                f"rollout{i}",
                tuple(range(first + i * tp, first + (i + 1) * tp)),
                r.gpu_memory_utilization or SEPARATE_FRACTION,
            )
            for i in range(launched)
        )
    else:
        fraction = r.gpu_memory_utilization or round(_turn_share(servers.placement) / _engines_per_gpu(r, t), 4)
        rollout = tuple(
            Slot(f"rollout{i}", tuple((i * tp + k) % t.num_ranks for k in range(tp)), fraction) for i in range(launched)
        )
    transport = sync_transport(servers, rollout, peer_access or _peer_access)
    if transport == "cuda_ipc":  # engines away from the sender's GPU see it after their own
        rollout = tuple(s if 0 in s.devices else replace(s, peer_devices=(0,)) for s in rollout)
    return Plan(trainer, rollout, num_gpus, transport)


def _peer_access(a: int, b: int) -> bool:
    import torch

    return torch.cuda.can_device_access_peer(b, a)


def _engines_per_gpu(rollout, trainer: TrainerConfig) -> int:
    return math.ceil(rollout.servers_to_launch * rollout.tensor_parallel_size / trainer.num_ranks)


def _turn_share(pl: PlacementConfig) -> float:
    return TURN_FRACTION if pl.sleep_level > 0 and pl.offload else SHARED_FRACTION


def visible_gpus() -> int:
    """GPUs this process can use (0 on a CPU-only host or torch without CUDA)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def engine_memory_fraction(cfg: RolloutRole, cpu_platform: bool) -> float:
    """The vLLM memory fraction of a server: rollout.gpu_memory_utilization when set (the launcher sets it
    from the plan), else that of a lone engine (`rlx rollout-serve` by hand), scaled to placement.gpu_memory_gb."""
    if cpu_platform:
        return cfg.rollout.gpu_memory_utilization or CPU_FRACTION
    fraction = cfg.rollout.gpu_memory_utilization or SEPARATE_FRACTION
    return fraction * budget_fraction(cfg.placement.gpu_memory_gb)


KV_MARGIN = 1.25
"""Colocated KV cache: this much more than a step's samples at rollout.max_model_len hold."""


def kv_cache_bytes(cfg: RolloutRole, model_config: dict) -> int | None:
    """The KV cache per GPU of one engine: rollout.kv_cache_gb when set; colocated, room for the engine's share of a
    step's samples (a step's ``prompts_per_step * n`` over the launched servers, at most rollout.max_num_seqs at
    once) at rollout.max_model_len tokens each, ``KV_MARGIN`` over; else None (vLLM sizes it from the memory
    fraction). ``model_config``: the model's config.json; None also where it lacks the shape to count from."""
    r = cfg.rollout
    if r.kv_cache_gb is not None:
        return int(r.kv_cache_gb * 2**30)
    if cfg.placement.mode != "colocated":
        return None
    text = model_config.get("text_config", model_config)
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not layers or not heads or not text.get("hidden_size"):
        return None
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    per_token = (
        2 * layers * max(1, kv_heads // r.tensor_parallel_size) * head_dim * _dtype_bytes(cfg.model.engine_dtype)
    )
    samples = -(-cfg.samples_per_step // max(1, r.servers_to_launch))
    if r.max_num_seqs:
        samples = min(samples, r.max_num_seqs)
    return int(KV_MARGIN * samples * r.max_model_len * per_token)


OFFLOAD_SHARE = 0.5
"""placement.offload unset: the trainer stays on its GPU while its state and the engine's awake memory take at most
this share of it (the rest is the trainer's activations, the allocators' caches and the CUDA contexts)."""
ENGINE_ROOM_BYTES = 4 * 2**30
"""An awake engine's memory beside its weights and KV cache: activations, CUDA graphs, the sampler."""


def resolve_offload(trainer: TrainerRole, servers: RolloutRole, gpu_bytes: int | None) -> tuple[bool, str]:
    """placement.offload made concrete, and why: as set; else (unset) on for a colocated single-rank trainer whose
    state (``trainer_state_bytes``) and the engine's awake memory exceed ``OFFLOAD_SHARE`` of its GPU
    (``gpu_bytes``, None on a host without one), or where the model's size cannot be read."""
    pl, model = servers.placement, trainer.model
    if pl.offload is not None:
        return pl.offload, "as placement.offload says"
    if pl.mode != "colocated" or trainer.trainer.num_ranks > 1 or not gpu_bytes:
        return False, "nothing to offload to make room"
    params = count_parameters(model.path)
    if params is None:
        return True, f"the size of {model.path} is unknown"
    state = trainer_state_bytes(trainer, params)
    kv = model_kv_cache_bytes(servers)
    engine = params * _dtype_bytes(model.engine_dtype) + (kv or 0) + ENGINE_ROOM_BYTES
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    sizes = f"its state {gib(state)} and the engine's {gib(engine)} of {gib(gpu_bytes)}"
    if kv is None or state + engine > OFFLOAD_SHARE * gpu_bytes:
        return True, f"the trainer offloads while the engine generates ({sizes})"
    return False, f"the trainer stays on the GPU while the engine generates ({sizes}; placement.offload=true moves it)"


def count_parameters(model_dir: str) -> int | None:
    """Elements of every tensor in ``model_dir``'s safetensors files (their headers only); None without any."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118 - not a dict
    return total


def trainer_state_bytes(cfg: TrainerRole, params: int) -> int:
    """What one trainer rank keeps on its GPU between steps for a model of ``params`` elements: the weights, their
    gradients and AdamW's two moments in model.dtype (with LoRA only the weights: the adapter is small), and a
    reference model where the KL term needs one."""
    width = _dtype_bytes(cfg.model.dtype)
    state = params * width * (1 if cfg.model.lora.rank else 4)
    if cfg.algorithm.kl_coef > 0:
        state += params * width
    return state


def model_kv_cache_bytes(cfg: RolloutRole) -> int | None:
    """``kv_cache_bytes`` for model.path's own config.json; None where the directory has none."""
    config = Path(cfg.model.path, "config.json")
    return kv_cache_bytes(cfg, json.loads(config.read_text())) if config.is_file() else None


def _dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 2)


def gpu_bytes(trainer: TrainerConfig, placement: PlacementConfig) -> int | None:
    """The memory of the first visible GPU, within placement.gpu_memory_gb; None where the run uses no GPU."""
    if not uses_gpus(trainer, visible_gpus()):
        return None
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    return int(total * budget_fraction(placement.gpu_memory_gb))


def budget_fraction(gpu_memory_gb: float) -> float:
    """The share of this process's GPU that ``placement.gpu_memory_gb`` allows (1.0 = no budget, or no GPU)."""
    if not gpu_memory_gb:
        return 1.0
    import torch

    if not torch.cuda.is_available():
        return 1.0
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return min(1.0, gpu_memory_gb * 2**30 / total)


def apply_memory_budget(gpu_memory_gb: float) -> None:
    """Hold this process to ``placement.gpu_memory_gb`` of its GPU (torch's per-process memory fraction): a
    smaller GPU emulated on a larger one. Nothing on a CPU host or without a budget."""
    fraction = budget_fraction(gpu_memory_gb)
    if fraction < 1.0:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction)


def device_type(want: str) -> str:
    """The one device rule of every role: ``cuda`` when asked, or on ``auto`` when a GPU is visible; else ``cpu``."""
    import torch

    return "cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu"


def set_cpu_threads(threads: int, device) -> None:
    """``trainer.cpu_threads`` / ``rollout.cpu_threads``: this process's intra-op threads when it computes on
    the CPU; 0 leaves torch's default (one per core)."""
    import torch

    if threads > 0 and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
