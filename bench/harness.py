"""The benchmarks' harness: child processes and ports, CPU meters, client logs and
watchdogs, py-spy profiling, percentiles, signal handling. The scenarios are in
``proxy_bench.py`` (and the other ``*_bench.py``)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
from confluent_kafka import KafkaException

HOST = "127.0.0.1"
MB = 1_000_000
GB = 1_000_000_000
WORKLOAD_TIMEOUT_S = 180.0   # a workload that takes longer fails
STALL_TIMEOUT_S = 20.0       # ... and so does one without progress for this long

# ---------------------------------------------------------------------------- processes


@dataclass
class ManagedProcess:
    """A child process in its own session, so the whole group can be signalled."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def spawn(cls, name: str, argv: list[str], log_dir: Path) -> ManagedProcess:
        log_path = log_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     cwd=log_dir, env=os.environ | {"PYTHONUNBUFFERED": "1"})
        return cls(name, popen, log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def check_alive(self) -> None:
        rc = self.popen.poll()
        if rc is not None:
            raise RuntimeError(f"{self.name} (pid {self.pid}) exited with code {rc}; "
                               f"log tail:\n{self.log_tail()}")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, timeout: float = 5.0) -> None:
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        # the leader may be gone while other members of its group live on
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)


def wait_ready(process: ManagedProcess, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        process.check_alive()
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{process.name}: nothing listens on {HOST}:{port} after "
                                   f"{timeout}s; log tail:\n{process.log_tail()}") from None
            time.sleep(0.05)


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_port_range(count: int, avoid: set[int], attempts: int = 100) -> tuple[int, int]:
    for _ in range(attempts):
        base = random.randint(20_000, 60_000 - count)
        ports = range(base, base + count)
        if not avoid.intersection(ports) and all(_port_is_free(p) for p in ports):
            return base, base + count - 1
    raise RuntimeError(f"found no {count} consecutive free ports")


# ---------------------------------------------------------------------------- measurements


class CpuMeter:
    """user+sys CPU seconds of a process (all its threads), or nothing if there is none."""

    def __init__(self, pid: int | None) -> None:
        self._process = psutil.Process(pid) if pid is not None else None

    def read(self) -> float | None:
        if self._process is None:
            return None
        times = self._process.cpu_times()
        return float(times.user + times.system)


class TreeCpuMeter:
    """user+sys CPU seconds of a process and all its descendants (a supervisor and its
    workers), those that exited and were waited for included (their parent's children_*
    times). ``processes`` is how many were alive at the last read."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self.processes = 0

    def read(self) -> float:
        total, alive = 0.0, 0
        for proc in (self._root, *self._root.children(recursive=True)):
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                if proc is self._root:
                    raise
                continue                      # gone meanwhile: counted once its parent waits
            total += t.user + t.system + t.children_user + t.children_system
            alive += 1
        self.processes = alive
        return float(total)


class ForeignCpu:
    """Approximate CPU seconds used by processes other than this benchmark and its children
    (user+nice+system of the machine minus ours): shows whether something else disturbed the run."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float]:
        t = psutil.cpu_times()
        machine = t.user + t.nice + t.system
        me = psutil.Process()
        ours = 0.0
        for proc in (me, *me.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                ours += times.user + times.system
        return float(machine), ours

    def seconds(self) -> float:
        machine, ours = self._sample()
        return max(0.0, (machine - self._start[0]) - (ours - self._start[1]))


@dataclass(frozen=True)
class Measurement:
    seconds: float
    messages: int
    bytes: int
    mb_per_s: float
    middlebox_cpu_s: float | None        # CPU seconds of the proxy process in between
    middlebox_cpu_s_per_gb: float | None

    @classmethod
    def of(cls, seconds: float, messages: int, nbytes: int,
           cpu_before: float | None, cpu_after: float | None) -> Measurement:
        cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        return cls(seconds, messages, nbytes, nbytes / MB / seconds, cpu,
                   None if cpu is None else cpu / (nbytes / GB))


class WorkloadError(Exception):
    pass


# what a failing path raises
WORKLOAD_FAILURES = (WorkloadError, KafkaException, TimeoutError)


class ClientLog:
    """librdkafka's log lines of one client, collected instead of printed so that a workload
    can quote them (librdkafka hands them over with Python logging levels)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.lines.append((level, fmt % args if args else fmt))

    def summary(self, min_level: int = 0, examples: int = 2) -> str | None:
        picked = [msg for level, msg in self.lines if level >= min_level]
        if not picked:
            return None
        distinct = list(dict.fromkeys(re.sub(r"\d+ms", "Nms", msg) for msg in picked))
        return f"librdkafka logged {len(picked)} line(s), e.g. " + " | ".join(distinct[:examples])


class Watchdog:
    """Ends a workload that makes no progress for ``stall_s`` or runs past ``timeout_s``."""

    def __init__(self, what: str, total: int, log: ClientLog,
                 stall_s: float = STALL_TIMEOUT_S, timeout_s: float = WORKLOAD_TIMEOUT_S) -> None:
        self.what, self.total, self.log = what, total, log
        self.stall_s, self.timeout_s = stall_s, timeout_s
        self.started = self.last_progress = time.monotonic()
        self.done = 0

    def check(self, done: int) -> None:
        now = time.monotonic()
        if done != self.done:
            self.done, self.last_progress = done, now
        problem = None
        if now - self.last_progress > self.stall_s:
            problem = f"no progress for {self.stall_s:.0f}s"
        elif now - self.started > self.timeout_s:
            problem = f"not done after {self.timeout_s:.0f}s"
        if problem:
            log = self.log.summary()
            raise WorkloadError(f"{self.what}: {problem}, at {done}/{self.total} messages"
                                + (f"; {log}" if log else ""))


# ---------------------------------------------------------------------------- profiling


@dataclass(frozen=True)
class ProfileResult:
    svg: str | None
    raw: str | None
    native: bool                         # recorded with --native (C frames of uvloop, libc)
    samples: int
    idle_samples: int                    # waiting in epoll: the proxy had nothing to do
    top_own: list[tuple[str, int]]       # (function (file), own samples), most first
    waiting_samples: int = 0             # other threads blocked on a lock, a queue or the GIL
    # busy samples by part (a stack counts for every part it passes through): PROFILE_PARTS
    parts: dict[str, int] = field(default_factory=dict)


# The parts of the proxy a busy sample may pass through (a regular expression on its frames),
# and the system calls that move bytes (the leaf frame).
PROFILE_PARTS = {
    "quotas": re.compile(r"kafka_quota_proxy/(quota/|proxy/features/quotas/)"),
    "capture": re.compile(r"kafka_quota_proxy/proxy/features/capture/"),
    "fetch routing": re.compile(r"kafka_quota_proxy/(routing/|proxy/features/fetch_routing/)"),
    "protocol": re.compile(r"kafka_quota_proxy/protocol/"),
}
SYSCALL_LEAF = re.compile(r"^(read|readv|write|writev|recv|recvfrom|recvmsg|send|sendto|"
                          r"sendmsg|splice|__libc_\w+) \(")


def busy_parts(raw_text: str) -> dict[str, int]:
    """Busy samples (neither idle in epoll nor blocked) of a py-spy raw profile that pass
    through each of ``PROFILE_PARTS``, and (``syscalls``) those whose leaf is a system call
    that reads or writes."""
    parts: Counter[str] = Counter()
    for line in raw_text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_LINE_NO.sub(")", f) for f in stack.split(";")]
        if _IDLE.match(frames[-1]) or _blocked(frames):
            continue
        n = int(count)
        for name, pattern in PROFILE_PARTS.items():
            if any(pattern.search(f) for f in frames):
                parts[name] += n
        if SYSCALL_LEAF.match(frames[-1]):
            parts["syscalls (read/write)"] += n
    return dict(parts)


def pyspy_record(pyspy: str, pid: int, out: Path, fmt: str, native: bool, duration_s: int,
                  workload: Callable[[], None], log_dir: Path) -> bool:
    argv = [pyspy, "record", "--pid", str(pid), "--output", str(out), "--format", fmt,
            "--duration", str(duration_s), "--rate", "250", "--function",
            *(["--native"] if native else [])]
    recorder = ManagedProcess.spawn(f"py-spy-{fmt}", argv, log_dir)
    try:
        time.sleep(1.0)                       # let it attach
        recorder.check_alive()
        workload()
        recorder.signal(signal.SIGINT)        # py-spy writes its output on Ctrl-C
        recorder.popen.wait(60)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"  py-spy ({fmt}) failed: {exc}", file=sys.stderr)
    finally:
        recorder.stop()
    if not out.is_file():
        print(f"  py-spy wrote no {out.name}; its log:\n{recorder.log_tail()}", file=sys.stderr)
        return False
    return True


_LINE_NO = re.compile(r":\d+\)$")
_UNRESOLVED = re.compile(r"^0x[0-9a-f]+ \((.+)\)$")
_IDLE = re.compile(r"^(epoll_wait|epoll_pwait2?|poll|ppoll|select|pselect6?) \(")
# A thread asleep in the interpreter (a lock, a Queue.get, time.sleep, waiting for the GIL):
# with --native py-spy samples it like a running one, its leaf an unresolved libc frame.
_BLOCKED = re.compile(r"^(PyThread_acquire_lock_timed|take_gil|pysleep|PyCOND_TIMEDWAIT) \(")
_NATIVE_LIBC = re.compile(r"^(0x[0-9a-f]+ \(libc[.-]|(syscall|futex_\w+|__futex\w*|"
                          r"pthread_cond_\w+|__pthread_cond\w*|clock_nanosleep|nanosleep) \()")


def _blocked(frames: list[str]) -> bool:
    """Whether the stack ends in a blocking interpreter call and libc frames below it."""
    for frame in reversed(frames):
        if _BLOCKED.match(frame):
            return True
        if not _NATIVE_LIBC.match(frame):
            return False
    return False


def own_time_from_raw(raw_text: str,
                      top: int = 20) -> tuple[int, int, int, list[tuple[str, int]]]:
    """py-spy raw output is collapsed stacks ``f1;f2;...;fn count``: fn has the own time.
    Returns (samples, idle samples (epoll), waiting samples (a thread blocked on a lock, a
    queue or the GIL), top leaf frames of the busy samples)."""
    own: Counter[str] = Counter()
    total = idle = waiting = 0
    for line in raw_text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_LINE_NO.sub(")", f) for f in stack.split(";")]
        leaf = frames[-1]
        if _IDLE.match(leaf):
            idle += n
            continue
        if _blocked(frames):
            waiting += n
            continue
        own[_UNRESOLVED.sub(r"<unresolved> (\1)", leaf)] += n
    return total, idle, waiting, own.most_common(top)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---------------------------------------------------------------------------- CLI


class Terminated(BaseException):
    """SIGTERM/SIGHUP, turned into an exception so ``finally`` blocks stop the children."""


class SignalGuard:
    """Turns SIGINT/SIGTERM/SIGHUP into exceptions (so ``finally`` blocks stop the children)
    and remembers the signal: a librdkafka call it interrupts may surface as ``SystemError``
    ("returned NULL without setting an exception") instead of ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, _frame: Any) -> None:
        self.received = signal.Signals(signum).name
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(self.received)

    def __enter__(self) -> SignalGuard:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is not signal.SIG_IGN:   # respect nohup and friends
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)


def run_interruptible(run: Callable[[], Any]) -> Any:
    """``run()`` under a ``SignalGuard``; None (after saying so) when a signal stopped it."""
    guard = SignalGuard()
    try:
        with guard:
            return run()
    except (KeyboardInterrupt, Terminated, SystemError):
        if guard.received is None:
            raise
        print(f"\ninterrupted by {guard.received}; child processes stopped", file=sys.stderr)
        return None


