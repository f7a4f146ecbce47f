"""Once started, the proxy moves what it is made of out of the garbage collector's sight
(``server.settle_heap``), so that the full collections serving sets off go over what serving
made, not over every module and schema: they stopped the event loop for 30-70 ms each
before (docs/performance.md, "Latency: the collector's pauses")."""

from __future__ import annotations

import gc
import weakref

from kafka_quota_proxy.proxy.server import settle_heap


class _Node:
    me: _Node


def test_once_started_only_what_comes_after_is_in_the_collectors_sight() -> None:
    left = _Node()
    left.me = left  # what starting left behind, in a cycle: only the collector frees it
    gone = weakref.ref(left)
    del left
    try:
        settle_heap()
        assert gone() is None  # collected first: not kept for the life of the process
        assert gc.get_freeze_count() > 20_000  # the modules, schemas, config
        assert len(gc.get_objects()) < 2_000  # what a full collection goes over now
        made = [_Node() for _ in range(100)]
        assert len(gc.get_objects()) >= 100 and made
    finally:
        gc.unfreeze()
