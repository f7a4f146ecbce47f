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
"""

from __future__ import annotations

from array import array

from kafka_quota_proxy.quota.throttle import rate_per_second


class SampledRate:
    __slots__ = ("_current", "_floor", "_last", "_starts", "_values", "samples", "window_ms")

    def __init__(self, samples: int, window_ms: int) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError("samples and window_ms must be positive")
        self.samples = samples
        self.window_ms = window_ms
        # Compact arrays, not lists of boxed numbers: with 100,000 live budgets the per-record
        # cost is mostly CPU cache misses, and this keeps one budget's samples together.
        self._starts = array("q")
        self._last = array("q")
        self._values = array("d")
        self._current = 0
        # At most the oldest last-event time: samples' last events only move forward, so while
        # ``now - _floor`` is under the purge age no sample can be due and the scan is skipped.
        self._floor = 0

    def _ensure(self, now_ms: int) -> None:
        if not self._starts:
            self._starts.append(now_ms)
            self._last.append(now_ms)
            self._values.append(0.0)
            self._floor = now_ms

    def record(self, value: float, now_ms: int) -> None:
        if not self._starts:
            self._ensure(now_ms)
        i = self._current
        if now_ms - self._starts[i] >= self.window_ms:
            i = self._current = (i + 1) % (self.samples + 1)
            if i >= len(self._starts):
                self._starts.append(now_ms)
                self._last.append(now_ms)
                self._values.append(0.0)
            else:
                self._starts[i] = now_ms
                self._last[i] = now_ms
                self._values[i] = 0.0
        self._values[i] += value
        self._last[i] = now_ms

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        if now_ms - self._floor < expire:
            return
        last = self._last
        for i in range(len(last)):
            if now_ms - last[i] >= expire:
                self._starts[i] = now_ms
                last[i] = now_ms
                self._values[i] = 0.0
        self._floor = min(last)

    def peek(self, now_ms: int) -> tuple[float, int]:
        """``(sum of the samples, W in ms)`` as the quota check at ``now_ms`` would see them,
        as if the samples due were purged then; changes nothing."""
        starts = self._starts
        if not starts:
            elapsed = 0
            total = 0.0
        elif now_ms - self._floor >= self.samples * self.window_ms:
            expire = self.samples * self.window_ms
            last, values = self._last, self._values
            oldest = now_ms
            total = 0.0
            for i in range(len(starts)):
                if now_ms - last[i] < expire:
                    total += values[i]
                    if starts[i] < oldest:
                        oldest = starts[i]
            elapsed = now_ms - oldest
        else:
            elapsed = now_ms - min(starts)
            total = sum(self._values)
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return total, elapsed

    def samples_at(self, now_ms: int) -> list[tuple[int, int, float]]:
        """The samples with a value that a quota check at ``now_ms`` counts, as ``(start, last
        event, value)`` (what a process reports of a budget it shares: ``quota.shared``)."""
        expire = self.samples * self.window_ms
        return [(s, last, v) for s, last, v in zip(self._starts, self._last, self._values,
                                                   strict=True)
                if v > 0.0 and now_ms - last < expire]

    def oldest_start(self, now_ms: int) -> int:
        """``min(start)`` over the samples a quota check at ``now_ms`` keeps (one due for
        purging counts as reset at ``now_ms``); ``now_ms`` when there is none."""
        expire = self.samples * self.window_ms
        oldest = now_ms
        for s, last in zip(self._starts, self._last, strict=True):
            if now_ms - last < expire and s < oldest:
                oldest = s
        return oldest

    def window_size_ms(self, now_ms: int) -> int:
        """Kafka's ``Rate.windowSize``: the W the rate and the throttle time use (a pure read)."""
        return self.peek(now_ms)[1]

    def record_and_measure(self, value: float, now_ms: int) -> tuple[float, int]:
        """``record(value, now_ms)`` then ``measure(now_ms)``, in one call: the quota engine's
        per-request path, in the proxy and in every replay."""
        starts = self._starts
        if not starts:
            self._ensure(now_ms)
        window_ms = self.window_ms
        samples = self.samples
        i = self._current
        if now_ms - starts[i] >= window_ms:
            i = self._current = (i + 1) % (samples + 1)
            if i >= len(starts):
                starts.append(now_ms)
                self._last.append(now_ms)
                self._values.append(0.0)
            else:
                starts[i] = now_ms
                self._last[i] = now_ms
                self._values[i] = 0.0
        values = self._values
        values[i] += value
        self._last[i] = now_ms
        if now_ms - self._floor >= samples * window_ms:
            self._purge(now_ms)
        elapsed = now_ms - min(starts)
        full = elapsed // window_ms
        if full < samples - 1:
            elapsed += (samples - 1 - full) * window_ms
        if elapsed:
            return sum(values) / (elapsed / 1000.0), elapsed
        return rate_per_second(sum(values), 0), 0

    def measure(self, now_ms: int) -> tuple[float, int]:
        """``(rate per second, W in ms)`` at ``now_ms`` (a pure read: see the module's doc)."""
        total, window = self.peek(now_ms)
        return rate_per_second(total, window), window

    def purge(self, now_ms: int) -> None:
        """Reset the samples due at ``now_ms``, as the quota check after a record does."""
        if self._starts:
            self._purge(now_ms)

    def total(self) -> float:
        return sum(self._values)
