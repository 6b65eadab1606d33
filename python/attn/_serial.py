"""One call at a time on an object whose C++ state is not thread-safe (a Decoder's KV caches and
activations, a Model's context): calls from several threads wait for each other, so each gets
the result it would get alone. A call made from inside another on the same thread (a stream
callback calling the model it streams from) would corrupt the running call's context and is an
error instead."""
from __future__ import annotations

import threading


class Serial:
    """A lock per object (not per process: two models run in parallel)."""

    def __init__(self, what: str):
        self._lock = threading.Lock()
        self._owner = None
        self._what = what

    def __enter__(self):
        me = threading.get_ident()
        if self._owner == me:
            raise RuntimeError(f"{self._what} is already running a call on this thread (a callback may not "
                               f"use the {self._what} it was called from)")
        self._lock.acquire()
        self._owner = me
        return self

    def __exit__(self, *exc):
        self._owner = None
        self._lock.release()
        return False
