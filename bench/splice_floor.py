#!/usr/bin/env python
"""The floor of a proxy's CPU per GB on this machine: what a process in the middle of one
loopback TCP stream spends moving 1 GB, with nothing but the moving to do.

A source process writes 1 GB as fast as it can to the middle process, which passes it on to a
sink process that discards it. The middle moves the bytes three ways, each measured by its own
user + system CPU (``getrusage``) per GB moved:

- ``bytes``: ``recv`` into a new ``bytes`` object, ``sendall`` it (what uvloop does for a
  plain protocol);
- ``copy``: ``recv_into`` one reused buffer, ``sendall`` a view of it;
- ``splice``: socket to pipe to socket in the kernel (``os.splice``), what
  ``proxy.splice`` does for record batches.

Blocking sockets, 256 KiB reads (``--chunk``), one stream: no event loop, no parsing, no
second connection. The proxy cannot go below these figures; the gap between them and the
proxy's own (``proxy_bench.py``) is the proxy's.

    python bench/splice_floor.py [--gb 1] [--chunk 262144] [--rounds 2]
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing as mp
import os
import resource
import socket
import time

GB = 1 << 30
MODES = ("bytes", "copy", "splice")
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def _source(port: int, total: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        block = os.urandom(1 << 20)
        sent = 0
        while sent < total:
            sent += s.send(block)


def _sink(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    buf = bytearray(1 << 20)
    while conn.recv_into(buf):
        pass


def measure(mode: str, total: int, chunk: int) -> dict[str, float]:
    """The middle's CPU per GB moving ``total`` bytes ``mode``'s way."""
    ins = socket.create_server(("127.0.0.1", 0))
    outs = socket.create_server(("127.0.0.1", 0))
    sink = mp.Process(target=_sink, args=(outs,))
    sink.start()
    source = mp.Process(target=_source, args=(ins.getsockname()[1], total))
    source.start()
    a, _ = ins.accept()
    b = socket.create_connection(outs.getsockname())
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    moved = 0
    if mode == "bytes":
        while data := a.recv(chunk):
            b.sendall(data)
            moved += len(data)
    elif mode == "copy":
        buf = bytearray(chunk)
        view = memoryview(buf)
        while n := a.recv_into(buf):
            b.sendall(view[:n])
            moved += n
    else:
        r, w = os.pipe()
        fcntl.fcntl(w, _F_SETPIPE_SZ, 1 << 20)
        while n := os.splice(a.fileno(), w, 1 << 20):
            left = n
            while left:
                left -= os.splice(r, b.fileno(), left)
            moved += n
        os.close(r)
        os.close(w)
    elapsed, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    b.close()
    a.close()
    source.join()
    sink.join()
    ins.close()
    outs.close()
    gb = moved / GB
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"mb_per_s": moved / elapsed / 1e6, "user": user / gb, "system": system / gb,
            "total": (user + system) / gb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--chunk", type=int, default=256 * 1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; core-s per GB moved by the middle process")
    for round_no in range(args.rounds):
        for mode in MODES:
            r = measure(mode, int(args.gb * GB), args.chunk)
            print(f"round {round_no} {mode:<7} {r['mb_per_s']:7.0f} MB/s  user {r['user']:.3f}"
                  f"  system {r['system']:.3f}  total {r['total']:.3f}", flush=True)


if __name__ == "__main__":
    main()
