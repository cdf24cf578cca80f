"""StopWatch: a child's death reported on another thread, or SIGTERM / SIGHUP, stops the run's main coroutine."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from rlx.launch.stops import ChildDied, Interrupted, StopWatch, Terminated


def test_death_during_the_event_loop_raises_even_where_callbacks_swallow_exceptions():
    deaths = StopWatch()
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

    with deaths.installed(), pytest.raises(ChildDied, match="rollout0 .* exited with code -9"):
        asyncio.run(deaths.guard(run()))
    assert not swallowed


def test_death_reported_before_the_loop_starts_raises_at_once():
    deaths = StopWatch()
    deaths.reasons.append(ChildDied("trainer1 (pid 2) exited with code 1"))

    async def never():
        await asyncio.sleep(30)

    with pytest.raises(ChildDied, match="trainer1"):
        asyncio.run(deaths.guard(never()))


def test_a_cancellation_without_a_death_stays_a_cancellation():
    deaths = StopWatch()

    async def run():
        inner = asyncio.ensure_future(deaths.guard(asyncio.sleep(30)))
        await asyncio.sleep(0.05)
        inner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inner

    asyncio.run(run())


def run_absorbing_one_cancellation(watch: StopWatch, stop) -> tuple[asyncio.Task, list[str]]:
    """A run whose task awaits a hung peer and whose ``finally`` awaits it again (resume after a failed sync),
    absorbing one cancellation; ``stop`` fires 0.2 s in. The ended task (within 20 s, long before the peer's
    60 s deadline) and what its clean-up got through."""
    clean_ups = []

    async def run():
        threading.Timer(0.2, stop).start()
        try:
            await asyncio.sleep(60)  # a request to the peer
        finally:
            clean_ups.append("started")
            await asyncio.sleep(60)  # resume() to the peer, with its deadline
            clean_ups.append("finished")

    async def main():
        task = asyncio.ensure_future(watch.guard(run()))
        await asyncio.wait({task}, timeout=20)
        assert task.done(), "the run is still waiting on the hung peer"
        return task

    return asyncio.run(main()), clean_ups


def test_death_stops_a_run_whose_clean_up_awaits_the_dead_server():
    """The watch cancels again until the run's task ends."""
    deaths = StopWatch()
    with deaths.installed():
        task, clean_ups = run_absorbing_one_cancellation(
            deaths, lambda: deaths.report("rollout0 (pid 1) exited with code -9")
        )
    with pytest.raises(ChildDied, match="rollout0"):
        task.result()
    assert clean_ups == ["started"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_termination_signal_stops_the_event_loop_and_code_outside_it(signum):
    """Inside the loop the run's task ends with ``Terminated``; outside it, it is raised between bytecodes;
    during teardown (``shield``) it is only recorded; the previous handler is back afterwards."""
    previous = signal.getsignal(signum)

    async def run():
        threading.Timer(0.2, os.kill, args=(os.getpid(), signum)).start()
        await asyncio.sleep(30)

    in_loop = StopWatch()
    with in_loop.installed(), pytest.raises(Terminated) as caught:
        asyncio.run(in_loop.guard(run()))
    assert caught.value.exit_code == 128 + signum

    outside = StopWatch()
    with outside.installed():
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signum)
            threading.Event().wait(5)
        with outside.shield():
            os.kill(os.getpid(), signum)
            threading.Event().wait(0.1)
    assert [type(r) for r in outside.reasons] == [Terminated, Terminated]
    assert signal.getsignal(signum) == previous


def test_ctrl_c_stops_a_run_whose_clean_up_absorbs_one_cancellation_and_is_python_s_outside_the_loop():
    """asyncio's own Ctrl-C handling cancels the run's task once, which a wait on a hung server absorbs. The
    watch turns Ctrl-C into ``Interrupted`` and cancels until the task ends; outside the loop Ctrl-C stays
    ``KeyboardInterrupt``."""
    previous = signal.getsignal(signal.SIGINT)  # Python's, or SIG_IGN in a suite started in the background
    watch = StopWatch()
    with watch.installed():
        task, clean_ups = run_absorbing_one_cancellation(watch, lambda: os.kill(os.getpid(), signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(5)
    with pytest.raises(Interrupted) as caught:
        task.result()
    assert caught.value.exit_code == 130 and clean_ups == ["started"]
    assert signal.getsignal(signal.SIGINT) == previous
