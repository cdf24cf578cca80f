"""`rlx train launcher=ray`: the run's processes on the nodes of a Ray cluster.

The launcher (the `rlx train` process: a Ray driver, e.g. the entrypoint of ``ray job submit``)
joins the cluster named by ``ray.address`` or ``RAY_ADDRESS``, or starts a local Ray instance when
neither is given. Each role gets one placement group (``ray.rollout_resources`` /
``ray.trainer_resources`` per bundle, ``ray.strategy``); in each bundle a ``NodeProcess`` actor
(``rlx.launch.ray_actors``) starts one process on the node Ray chose:

* rollout server i: `rlx rollout-serve --address tcp://NODE_IP:PORT --allow-remote`, PORT free on
  that node (or ``rollout.port + i``), with the run's auth token (``rollout.auth_token``, or a fresh
  random one) in its environment, never in argv;
* trainer rank r: ``python -m rlx.trainer.ranks`` (rank 0: ``python -m rlx.launch.ray_actors``, the
  controller), rendezvous at rank 0's node IP and a port free there, ``rollout.servers`` = the
  servers' tcp:// addresses. Weights cross hosts over ``sync.transport`` (``auto`` picks a
  gloo/nccl broadcast when a server is on another host).

Every process's output comes back to the launcher: the console shows it prefixed with its name
(tracebacks folded, as the local launcher does), ``RUN_DIR/logs/<name>.log`` keeps all of it, and
``RUN_DIR/logs/ray_processes.json`` records where each one ran (node IP, process and actor pid, the actor's
work directory, removed when it stops).
The death watch is the local launcher's: a process that exits while the run needs it, or an
actor that dies with its node, stops the run with a line naming it and its log; the exit code is
non-zero. Rank 0 exiting 0 ends the run. Teardown, always: each process group ended on its node,
the actors killed, the placement groups removed, and a Ray instance this run started shut down.

Not here: restarting a dead rollout server (rollout.restart_on_failure is the local launcher's;
on Ray a death stops the run), and shipping files: the model and task data must be at the same
path on every node, and RUN_DIR should be shared storage (checkpoints are written by rank 0's node).
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlx.config.errors import ConfigError
from rlx.config.ray import check_ray_address
from rlx.config.roles import rollout_role, trainer_role, write_role
from rlx.launch.display import Display
from rlx.launch.launcher import (
    _trace_env,
    prepare,
    progress_bar_env,
    quiet_progress_bars,
    quiet_server_env,
    supervise,
)
from rlx.launch.processes import TracebackFolder, write_json
from rlx.launch.ray_probe import check_reachable
from rlx.launch.run_dir import (
    SECRET_ENV,
    secret_overrides,
    write_config,
)
from rlx.launch.stops import ChildDied, StopWatch

if TYPE_CHECKING:
    from rlx.config.schema import RunConfig

POLL_S = 0.5
RPC_TIMEOUT_S = 60.0
INSTALL_HINT = "pip install 'rlx[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"launcher=ray needs Ray, which is not installed; run `{INSTALL_HINT}`, "
            "or set launcher=local to run on this host"
        ) from None
    return ray


def cluster_address(cfg: RunConfig) -> str:
    """``ray.address``, else RAY_ADDRESS (set by `ray job submit`), else "local" (a fresh instance)."""
    if cfg.ray.address:
        return cfg.ray.address
    from_env = os.environ.get("RAY_ADDRESS", "")
    check_ray_address("RAY_ADDRESS", from_env)
    return from_env or "local"


def connect(cfg: RunConfig):
    """Join the cluster (or start a local instance); returns the ray module. An address where no cluster
    answers is refused within seconds (``rlx.launch.ray_probe``)."""
    ray = import_ray()
    address = cluster_address(cfg)
    if not ray.is_initialized():
        problem = (
            "" if address == "local" else check_reachable(address, "ray.address" if cfg.ray.address else "RAY_ADDRESS")
        )
        if problem:  # ray.init would retry for many minutes
            raise ConfigError(problem)
        extra = {"include_dashboard": False} if address == "local" else {}
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR", **extra)
        except ConnectionError as exc:
            raise ConfigError(
                f"ray.address={address!r}: cannot reach a Ray cluster ({exc}); start one with "
                "`ray start --head`, or leave ray.address empty to start a local instance"
            ) from None
    return ray


def bundle_options(resources: dict[str, float]) -> dict:
    """Ray actor options asking for a bundle's ``resources`` (CPU and GPU by their own keywords)."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0), "resources": custom}


def run_ray_train(cfg: RunConfig) -> int:
    """The whole run on Ray; returns the exit code. User errors found before anything starts propagate."""
    quiet_progress_bars()
    import_ray()
    run_dir = Path(cfg.trainer.output_dir).resolve()
    cfg.rollout.auth_token = (
        cfg.rollout.auth_token or os.environ.get(SECRET_ENV["rollout.auth_token"], "") or secrets.token_hex(16)
    )  # servers bind a node's address: never without a token
    display = Display(cfg.trainer.total_steps, enabled=cfg.logging.console)
    stops = StopWatch()
    with stops.installed():
        stopped = prepare(cfg, run_dir, display, "ray.log")
        if stopped is not None:
            return stopped
        run = RayRun(cfg, run_dir, display)
        return supervise(run, display, stops, "stopping every process of the run", passthrough=(ConfigError,))


@dataclass
class NodeHandle:
    """One process of the run: its actor, where it runs, and its log on this host."""

    name: str
    actor: object
    node: dict
    log_path: Path
    pid: int = 0
    console: TracebackFolder | None = None
    exit_code: int | None = None
    lost: str = ""  # why the actor is unreachable (its node died), if it is
    lines: list = field(default_factory=list)


class RayRun:
    """One run's placement groups and node processes, watched together and torn down together."""

    def __init__(self, cfg: RunConfig, run_dir: Path, display: Display) -> None:
        self.cfg, self.run_dir, self.display = cfg, run_dir, display
        self.log_dir = run_dir / "logs"
        self.handles: list[NodeHandle] = []
        self.groups: list = []
        self.ray = None
        self.started_ray = False

    def run(self) -> int:
        cfg = self.cfg
        self.started_ray = cluster_address(cfg) == "local"
        self.ray = connect(cfg)
        self.display.note(
            f"Ray cluster: {len(self.ray.nodes())} node(s); "
            f"{'a local instance started for this run' if self.started_ray else cluster_address(cfg)}"
        )
        _absolute_paths(cfg)
        secret_args, secret_env = secret_overrides(cfg)
        env = dict(_trace_env(cfg, self.run_dir), **secret_env, **progress_bar_env())
        servers = self._start_servers(env)
        cfg.rollout.servers = list(cfg.rollout.servers) + servers
        cfg.rollout.num_servers = 0
        self._start_ranks(secret_args, env)
        where = ", ".join(f"{h.name}@{h.node['ip']}" for h in self.handles)
        self.display.note(f"started on Ray: {where}")
        return self._watch()

    def _place(self, role: str, count: int, resources: dict[str, float]) -> list[NodeHandle]:
        """A placement group of ``count`` bundles and one NodeProcess actor in each."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rlx.launch.ray_actors import NodeProcess

        ray = self.ray
        group = placement_group([dict(resources)] * count, strategy=self.cfg.ray.strategy, name=f"rlx-{role}")
        self.groups.append(group)
        ready, _ = ray.wait([group.ready()], timeout=self.cfg.ray.placement_timeout_s)
        if not ready:
            raise ConfigError(
                f"the Ray cluster cannot place {count} {role} process(es) of {resources} each "
                f"(ray.{role}_resources, ray.strategy={self.cfg.ray.strategy}) within "
                f"{self.cfg.ray.placement_timeout_s:.0f} s; the cluster has "
                f"{_resources_text(ray.cluster_resources())}; lower ray.{role}_resources or add nodes "
                f"(`rlx doctor CONFIG launcher=ray` checks a layout)"
            )
        actor_class = ray.remote(NodeProcess)
        handles = []
        for index in range(count):
            name = f"{'rollout' if role == 'rollout' else 'trainer'}{index}"
            strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)
            actor = actor_class.options(
                name=None, max_restarts=0, scheduling_strategy=strategy, **bundle_options(resources)
            ).remote(name)
            handles.append(NodeHandle(name, actor, {}, self.log_dir / f"{name}.log"))
        nodes = ray.get([h.actor.node.remote() for h in handles], timeout=RPC_TIMEOUT_S)
        for handle, node in zip(handles, nodes, strict=True):
            handle.node = node
        self.handles.extend(handles)
        return handles

    def _launch(self, handle: NodeHandle, module_args: list[str], env: dict, files: dict[str, str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handle.log_path.write_text(f"rlx: starting {handle.name} on {handle.node['ip']}: {' '.join(module_args)}\n")
        handle.console = TracebackFolder(
            lambda line, n=handle.name: self.display.log_line(f"[{n}] {line}"), handle.log_path
        )
        handle.pid = self.ray.get(handle.actor.start.remote(module_args, env, files), timeout=RPC_TIMEOUT_S)
        self._write_processes()

    def _config_files(self) -> dict[str, str]:
        """The run's config as rank 0 loads it, and each role's view of it (``rlx.config.roles``) as the servers and
        the other ranks parse it: written on each process's own node (no shared storage needed)."""
        write_config(self.cfg, self.run_dir)
        roles = self.run_dir / "roles"
        write_role(rollout_role(self.cfg), roles / "rollout.json")
        write_role(trainer_role(self.cfg), roles / "trainer.json")
        return {
            "config.yaml": (self.run_dir / "config.yaml").read_text(),
            "rollout.json": (roles / "rollout.json").read_text(),
            "trainer.json": (roles / "trainer.json").read_text(),
        }

    def _start_servers(self, env: dict) -> list[str]:
        count = self.cfg.rollout.servers_to_launch
        if count == 0:
            return []
        handles = self._place("rollout", count, self.cfg.ray.rollout_resources)
        files = self._config_files()
        addresses = []
        for index, handle in enumerate(handles):
            port = self.cfg.rollout.port + index if self.cfg.rollout.port else handle.node["port"]
            address = f"tcp://{handle.node['ip']}:{port}"
            args = [
                "rlx",
                "rollout-serve",
                "{workdir}/rollout.json",
                "--address",
                address,
                "--index",
                str(index),
                "--allow-remote",
            ]
            self._launch(handle, args, dict(env, **quiet_server_env()), files)
            addresses.append(address)
        return addresses

    def _start_ranks(self, secret_args: list[str], env: dict) -> None:
        world = self.cfg.trainer.num_ranks
        handles = self._place("trainer", world, self.cfg.ray.trainer_resources)
        if (
            len({h.node["node_id"] for h in handles}) > 1
            and self.cfg.trainer.data_plane == "store"
            and self.cfg.store.transport == "shm"
        ):
            # shm is one host's memory: other nodes' ranks fetch their rows from rank 0 over TCP (with the run's token)
            self.cfg.store.transport = "tcp"
            self.display.note(
                "trainer ranks span several nodes: store.transport=tcp (rank 0 serves each rank its "
                "rows over TCP; the shm store is one host's memory)"
            )
        files = self._config_files()
        master = handles[0].node
        for rank, handle in enumerate(handles):
            module = "rlx.launch.ray_actors" if rank == 0 else "rlx.trainer.ranks"
            rank_env = dict(
                env, MASTER_ADDR=master["ip"], MASTER_PORT=str(master["port"]), WORLD_SIZE=str(world), RANK=str(rank)
            )
            args = [module, "{workdir}/config.yaml", *secret_args] if rank == 0 else [module, "{workdir}/trainer.json"]
            self._launch(handle, args, rank_env, files)

    def _write_processes(self) -> None:
        """logs/ray_processes.json: where each started process runs, for users and tests (a placed, not yet
        started process has no pid and is left out)."""
        record = {
            h.name: {
                "node_ip": h.node["ip"],
                "node_id": h.node["node_id"],
                "pid": h.pid,
                "actor_pid": h.node["actor_pid"],
                "workdir": h.node["workdir"],
            }
            for h in self.handles
            if h.pid > 0
        }
        write_json(self.log_dir / "ray_processes.json", record)

    def _watch(self) -> int:
        """Stream every process's output until rank 0 ends the run or another process dies."""
        rank0 = self.handles[-self.cfg.trainer.num_ranks]
        while True:
            self._poll_all()
            failed = [h for h in self.handles if h.exit_code or h.lost]
            if rank0.exit_code == 0 and not failed:
                return 0

            def follower_done(h):
                return h.exit_code == 0 and h is not rank0 and h.name.startswith("trainer")

            exited = [h for h in self.handles if h.lost or (h.exit_code is not None and not follower_done(h))]
            if exited:
                time.sleep(2.0)  # a death is often seen first as a peer's error: name the one that died first
                self._poll_all()
                failed = [h for h in self.handles if h.exit_code or h.lost]
                culprit = ([h for h in failed if h is not rank0] or failed or exited)[0]
                raise ChildDied(self._death_message(culprit))
            time.sleep(POLL_S)

    def _poll_all(self) -> None:
        from ray.exceptions import RayActorError

        live = [h for h in self.handles if h.exit_code is None and not h.lost]
        refs = [h.actor.poll.remote() for h in live]
        for handle, ref in zip(live, refs, strict=True):
            try:
                handle.exit_code, lines = self.ray.get(ref, timeout=RPC_TIMEOUT_S)
            except RayActorError as exc:
                handle.lost = f"its Ray actor died ({type(exc).__name__}: {str(exc).splitlines()[0]})"
                continue
            self._emit(handle, lines)

    def _emit(self, handle: NodeHandle, lines: list[str]) -> None:
        if not lines:
            return
        with open(handle.log_path, "a") as log:
            log.writelines(line + "\n" for line in lines)
        for line in lines:
            handle.console.feed(line)
        handle.console.flush()

    def _death_message(self, handle: NodeHandle) -> str:
        what = handle.lost or f"exited with code {handle.exit_code}"
        return f"{handle.name} (pid {handle.pid} on {handle.node['ip']}) {what}; its log is {handle.log_path}"

    def tear_down(self) -> None:
        """Every process group ended on its node, actors killed, placement groups removed, Ray left."""
        if self.ray is None:
            return
        from ray.util.placement_group import remove_placement_group

        started = time.monotonic()
        refs = [(h, h.actor.stop.remote()) for h in self.handles if h.pid and not h.lost]
        for handle, ref in refs:
            try:
                _, lines = self.ray.get(ref, timeout=RPC_TIMEOUT_S)
                self._emit(handle, lines)
            except Exception as exc:  # noqa: BLE001 - the node is gone: nothing of it to stop
                self.display.log(f"could not stop {handle.name} on {handle.node.get('ip')}: {exc}")
        for handle in self.handles:
            self.ray.kill(handle.actor)
        for group in self.groups:
            remove_placement_group(group)
        self.display.log(f"stopped every process of the run in {time.monotonic() - started:.1f} s")
        self.ray.shutdown()  # ends the instance this run started; only disconnects from a cluster
        self.display.close_log()


def _absolute_paths(cfg: RunConfig) -> None:
    """Paths resolved here, so that processes started in another directory (or node) find the same files."""
    cfg.trainer.output_dir = str(Path(cfg.trainer.output_dir).resolve())
    for section, key in (("model", "path"), ("task", "path"), ("task", "eval_path"), ("trace", "dir")):
        value = getattr(getattr(cfg, section), key)
        if value and Path(value).exists():
            setattr(getattr(cfg, section), key, str(Path(value).resolve()))


def _resources_text(resources: dict) -> str:
    shown = {k: v for k, v in resources.items() if not k.startswith(("node:", "memory", "object_store_memory"))}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())) or "no resources"
