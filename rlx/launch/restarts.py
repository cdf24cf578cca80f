"""What `rlx train` does when a child dies: restart a launched rollout server (rollout.restart_on_failure,
at most rollout.max_restarts times each), or stop the run.

Called from the process watcher's thread. A restart starts the server again at once (same address and
index, a new process group, its log appended) and hands the controller's event loop the news
(``Controller.server_restarted``): its requests in flight are re-issued to live servers, and it rejoins
once a sync has given it the current weights. Only once the run is under way (``attach``): a server
that dies during start-up, a trainer rank, and a server listed in rollout.servers (not launched, so
never watched) stop the run as before, with the message naming them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rlx.launch.processes import Child, ProcessSet

SERVER_PREFIX = "rollout"  # launched servers are children named rollout0, rollout1, ...


class ServerRestarts:
    def __init__(
        self,
        procs: ProcessSet,
        max_restarts: int,
        enabled: bool,
        stop: Callable[[str], None],
        note: Callable[[str], None],
    ) -> None:
        self.procs, self.max_restarts, self.enabled = procs, max_restarts, enabled
        self.stop, self.note = stop, note
        self._loop: asyncio.AbstractEventLoop | None = None
        self._controller = None

    def attach(self, controller) -> None:
        """From now on (inside the run's event loop) a dead launched server is restarted."""
        self._loop, self._controller = asyncio.get_running_loop(), controller

    def detach(self) -> None:
        self._loop = self._controller = None

    def on_death(self, child: Child, message: str) -> bool:
        """The watcher's ``on_death``: True when ``child`` was restarted (the watch goes on)."""
        loop, controller = self._loop, self._controller
        if not (self.enabled and loop is not None and child.name.startswith(SERVER_PREFIX)):
            self.stop(message)
            return False
        if child.restarts >= self.max_restarts:
            self.stop(
                f"{message}; it was restarted {child.restarts} time(s) already and rollout.max_restarts="
                f"{self.max_restarts} allows no more (raise it, or find why it dies in its log)"
            )
            return False
        fresh = self.procs.restart(child)
        if fresh is None:  # the run is being torn down
            return False
        self.note(f"{message}; restarted it as pid {fresh.pid} (restart {fresh.restarts} of {self.max_restarts})")
        index = int(child.name.removeprefix(SERVER_PREFIX))
        try:
            loop.call_soon_threadsafe(controller.server_restarted, index, self.stop)
        except RuntimeError:  # the run's event loop has closed: the run is over, the teardown stops it
            return False
        return True
