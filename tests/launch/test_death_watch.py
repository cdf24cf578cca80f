"""DeathWatch: a child's death reported on another thread stops the run's main coroutine."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from rlx.launch.launcher import ChildDied, DeathWatch


@pytest.fixture
def sigusr1_restored():
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_death_during_the_event_loop_raises_even_where_callbacks_swallow_exceptions(sigusr1_restored):
    deaths = DeathWatch()
    deaths.install()
    swallowed = []

    async def run():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: swallowed.append(context))

        def busy_callback():  # an event-loop callback, like a socket reader, that is running when the news comes
            loop.call_soon(busy_callback)

        loop.call_soon(busy_callback)
        threading.Timer(0.2, deaths.report, args=("rollout0 (pid 1) exited with code -9",)).start()
        await asyncio.sleep(30)
        return "finished"

    with pytest.raises(ChildDied, match="rollout0 .* exited with code -9"):
        asyncio.run(deaths.guard(run()))
    assert not swallowed


def test_death_reported_before_the_loop_starts_raises_at_once():
    deaths = DeathWatch()
    deaths.messages.append("trainer1 (pid 2) exited with code 1")

    async def never():
        await asyncio.sleep(30)

    with pytest.raises(ChildDied, match="trainer1"):
        asyncio.run(deaths.guard(never()))


def test_a_cancellation_without_a_death_stays_a_cancellation():
    deaths = DeathWatch()

    async def run():
        inner = asyncio.ensure_future(deaths.guard(asyncio.sleep(30)))
        await asyncio.sleep(0.05)
        inner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inner

    asyncio.run(run())
