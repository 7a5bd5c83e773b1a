"""The loader's stop request: a SIGTERM may land at any instant of the main thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The main thread waits on the stop request without pause while another thread
# sends SIGTERM after a varying delay, many times over: the handler then runs at
# every kind of instant of ``wait``, including the ones where a lock-based wait
# holds its lock. Run apart so a handler that waits on the main thread's own
# lock hangs that process, not the suite.
_ROUNDS = 300
_PROGRAM = textwrap.dedent(
    f"""
    import os, signal, threading, time
    from kmodkit.agent.lifecycle import install_stop_handlers

    for round in range({_ROUNDS}):
        stop = install_stop_handlers()
        delay = (round % 20) / 10_000
        threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM)).start()
        while not stop.wait(0):
            pass
        assert stop.wait(0) and stop.wait(1)
    print("stopped", {_ROUNDS})
    """
)


def test_a_sigterm_at_any_instant_of_the_wait_stops_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["stopped", str(_ROUNDS)]


def test_a_stop_set_from_another_thread_wakes_a_long_wait() -> None:
    program = textwrap.dedent(
        """
        import threading, time
        from kmodkit.agent.lifecycle import install_stop_handlers

        stop = install_stop_handlers()
        threading.Timer(0.1, stop.set).start()
        began = time.monotonic()
        assert stop.wait(30)
        print(round(time.monotonic() - began))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
