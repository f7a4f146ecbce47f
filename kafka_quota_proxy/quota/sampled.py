"""Kafka's sampled rate (``SampledStat`` + ``WindowedSum`` + ``Rate``), with time in ms.

- ``samples`` windows of ``window_ms`` each, kept in a ring of ``samples + 1`` slots (one extra
  so that purging still leaves ``samples`` windows).
- ``record(v, t)``: if the current sample is complete (``t - start >= window_ms``) advance to
  the next slot and reset it with ``start = t`` (windows start at the first record, not on
  aligned boundaries); add ``v``; set that sample's last-event time to ``t``.
- ``record_and_measure(v, t)``: the quota check after a record: purge (reset with start = t)
  every sample whose last event is at least ``samples * window_ms`` old; ``W = t - min(start)``,
  padded to ``(samples - 1)`` full windows when fewer have elapsed (0 is possible with one
  sample, at the first record of a window: Java's division then gives infinity or NaN, and a
  throttle of 0); rate = ``sum / (W / 1000.0)``, in Kafka's order (``Rate.measure``, see
  ``quota.throttle``), so that every rate, and every throttle from it, is Kafka's to the last
  bit (``tests/unit/quota/test_kafka_exact.py`` holds it against a transcription of Kafka's).

Only recording changes the state. ``measure``, ``window_size_ms`` and ``peek`` give what a
purge at ``t`` would give, without purging, and never create the first sample: in Kafka a JMX
read purges too, and moves the window starts a later record sees, so a throttle would depend on
when the metrics were scraped. Here it depends only on what was recorded, and a replay of the
recorded requests gives every throttle the proxy gave.

Layout (``docs/performance.md``, the quota path with 100,000 budgets): one array of doubles
per rate, ``(start, last event, value)`` for each of its ``samples + 1`` slots, made at once
(times in ms are exact in a double); the oldest start is kept, recomputed only when a sample
begins or is purged; a rate of integral values (bytes: ``integral=True``) keeps its sum as it
goes, exact whatever the order (every partial sum is an integer below 2**53), where others
(request time, a percentage) sum their samples in slot order, as Kafka does.
"""

from __future__ import annotations

from array import array

from kafka_quota_proxy.quota.throttle import rate_per_second


class SampledRate:
    __slots__ = ("_current", "_floor", "_integral", "_oldest", "_s", "_slots", "_total",
                 "_used", "samples", "window_ms")

    def __init__(self, samples: int, window_ms: int, integral: bool = False) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError("samples and window_ms must be positive")
        self.samples = samples
        self.window_ms = window_ms
        self._slots = samples + 1
        # (start, last event, value) per slot, one block: with 100,000 live budgets the
        # per-record cost is mostly CPU cache misses
        self._s = array("d", bytes(24 * self._slots))
        self._used = 0  # slots begun (Kafka's list of samples grows as they begin)
        self._current = 0
        self._oldest = 0  # min(start) over the slots begun
        # At most the oldest last-event time: samples' last events only move forward, so while
        # ``now - _floor`` is under the purge age no sample can be due and the scan is skipped.
        self._floor = 0
        self._integral = integral
        self._total = 0.0  # (integral: the sum of the values)

    def _begin(self, now_ms: int) -> None:
        s = self._s
        s[0] = s[1] = now_ms
        s[2] = 0.0
        self._used = 1
        self._current = 0
        self._oldest = self._floor = now_ms

    def _advance(self, now_ms: int) -> int:
        """Begin the next sample at ``now_ms``; its index into ``_s``."""
        i = self._current = (self._current + 1) % self._slots
        j = 3 * i
        s = self._s
        if i >= self._used:
            self._used = i + 1
        else:
            self._total -= s[j + 2]
        s[j] = s[j + 1] = now_ms
        s[j + 2] = 0.0
        self._oldest = int(min(s[0:3 * self._used:3]))
        return j

    def record(self, value: float, now_ms: int) -> None:
        if not self._used:
            self._begin(now_ms)
        s = self._s
        j = 3 * self._current
        if now_ms - s[j] >= self.window_ms:
            j = self._advance(now_ms)
        s[j + 2] += value
        s[j + 1] = now_ms
        self._total += value

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        if now_ms - self._floor < expire:
            return
        s = self._s
        end = 3 * self._used
        for j in range(0, end, 3):
            if now_ms - s[j + 1] >= expire:
                self._total -= s[j + 2]
                s[j] = s[j + 1] = now_ms
                s[j + 2] = 0.0
        self._floor = int(min(s[1:end:3]))
        self._oldest = int(min(s[0:end:3]))

    def _sum(self) -> float:
        """The sum of the values, in slot order as Kafka sums them (integral: kept)."""
        if self._integral:
            return self._total
        return sum(self._s[2:3 * self._used:3])

    def peek(self, now_ms: int) -> tuple[float, int]:
        """``(sum of the samples, W in ms)`` as the quota check at ``now_ms`` would see them,
        as if the samples due were purged then; changes nothing."""
        if not self._used:
            elapsed = 0
            total = 0.0
        elif now_ms - self._floor >= self.samples * self.window_ms:
            expire = self.samples * self.window_ms
            s = self._s
            oldest = now_ms
            total = 0.0
            for j in range(0, 3 * self._used, 3):
                if now_ms - s[j + 1] < expire:
                    total += s[j + 2]
                    if s[j] < oldest:
                        oldest = int(s[j])
            elapsed = now_ms - oldest
        else:
            elapsed = now_ms - self._oldest
            total = self._sum()
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return total, elapsed

    def samples_at(self, now_ms: int) -> list[tuple[int, int, float]]:
        """The samples with a value that a quota check at ``now_ms`` counts, as ``(start, last
        event, value)`` (what a process reports of a budget it shares: ``quota.shared``)."""
        expire = self.samples * self.window_ms
        s = self._s
        return [(int(s[j]), int(s[j + 1]), s[j + 2]) for j in range(0, 3 * self._used, 3)
                if s[j + 2] > 0.0 and now_ms - s[j + 1] < expire]

    def oldest_start(self, now_ms: int) -> int:
        """``min(start)`` over the samples a quota check at ``now_ms`` keeps (one due for
        purging counts as reset at ``now_ms``); ``now_ms`` when there is none."""
        expire = self.samples * self.window_ms
        s = self._s
        oldest = now_ms
        for j in range(0, 3 * self._used, 3):
            if now_ms - s[j + 1] < expire and s[j] < oldest:
                oldest = int(s[j])
        return oldest

    def window_size_ms(self, now_ms: int) -> int:
        """Kafka's ``Rate.windowSize``: the W the rate and the throttle time use (a pure read)."""
        return self.peek(now_ms)[1]

    def record_and_measure(self, value: float, now_ms: int) -> tuple[float, int]:
        """``record(value, now_ms)`` then ``measure(now_ms)``, in one call: the quota engine's
        per-request path, in the proxy and in every replay."""
        if not self._used:
            self._begin(now_ms)
        s = self._s
        window_ms = self.window_ms
        j = 3 * self._current
        if now_ms - s[j] >= window_ms:
            j = self._advance(now_ms)
        s[j + 2] += value
        s[j + 1] = now_ms
        self._total += value
        samples = self.samples
        if now_ms - self._floor >= samples * window_ms:
            self._purge(now_ms)
        elapsed = now_ms - self._oldest
        full = elapsed // window_ms
        if full < samples - 1:
            elapsed += (samples - 1 - full) * window_ms
        total = self._total if self._integral else sum(s[2:3 * self._used:3])
        if elapsed:
            return total / (elapsed / 1000.0), elapsed
        return rate_per_second(total, 0), 0

    def measure(self, now_ms: int) -> tuple[float, int]:
        """``(rate per second, W in ms)`` at ``now_ms`` (a pure read: see the module's doc)."""
        total, window = self.peek(now_ms)
        return rate_per_second(total, window), window

    def purge(self, now_ms: int) -> None:
        """Reset the samples due at ``now_ms``, as the quota check after a record does."""
        if self._used:
            self._purge(now_ms)

    def total(self) -> float:
        return self._sum()
