"""SIGTERM and Ctrl-C during a run: where the first one may land, and a second that stops at once.

Both signals raise ``KeyboardInterrupt`` in the driver, so a run stops the same way for
either. Inside the loop the first one is held until the loop next waits for an event
(``waiting``, around the cluster's blocking wait): everywhere else the loop is changing the
core and the cluster together (an action issued but not yet submitted, an event taken but
not yet reported), and an exception there would leave them disagreeing, e.g. about a train
step in flight that the interrupt then waits for forever. In the wait nothing is half done.
A second signal raises wherever it lands: the run stops at once, without waiting for the
trainer or writing a checkpoint (the last one stays loadable).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["Interrupts", "interrupt_signals"]


class Interrupts:
    """The signals received (``received``, names in order) and where the first may land."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._holding = False    # inside the loop, outside its wait
        self._held = False       # a first signal arrived while holding

    @property
    def repeated(self) -> bool:
        """Whether a second signal came: stop at once."""
        return len(self.received) > 1

    def handler(self, signum, frame) -> None:
        self.received.append(signal.Signals(signum).name)
        if self._holding and not self.repeated:
            self._held = True
            return
        self._held = False   # this one raises; a held one is spent with it
        raise KeyboardInterrupt

    @contextmanager
    def held(self):
        """The loop's body: a first signal waits for the next ``waiting`` (or the end of the body)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self._raise_held()

    @contextmanager
    def waiting(self):
        """A blocking wait inside ``held``: the one place where a signal lands at once."""
        self._raise_held()
        holding, self._holding = self._holding, False
        try:
            yield
        finally:
            self._holding = holding

    def _raise_held(self) -> None:
        if self._held:
            self._held = False
            raise KeyboardInterrupt


@contextmanager
def interrupt_signals():
    """Install :class:`Interrupts`' handler for SIGTERM (what cluster schedulers send before
    they kill a job) and SIGINT; yields the ``Interrupts``. Installed after ``ray.init``, whose
    own SIGTERM handler would end the driver with a stack dump; the previous handlers are put
    back after. Off the main thread (where handlers cannot be set) nothing is installed."""
    interrupts = Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield interrupts
        return
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield interrupts
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
