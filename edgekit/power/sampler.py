"""A background thread that samples one power meter (and the process's memory) at a fixed
rate, and answers questions about windows of time: average and peak watts, joules.

If the sensor disappears mid-run, sampling stops, the reason is kept in ``lost``, and the
windows after that point are reported as incomplete rather than guessed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil

from edgekit.power.base import MeterUnavailable, PowerMeter


@dataclass(frozen=True, kw_only=True)
class PowerWindow:
    avg_w: float | None
    peak_w: float | None
    joules: float | None
    samples: int
    complete: bool  # False when the sensor was lost inside the window


class PowerSampler:
    def __init__(self, meter: PowerMeter, interval_s: float = 0.1) -> None:
        self.meter = meter
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (time, watts)
        self.lost: str | None = None
        self.lost_at: float | None = None
        self.peak_rss = 0
        self._process = psutil.Process()
        self._last_energy: tuple[float, float] | None = None
        self._stop = threading.Event()
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="edgekit-power", daemon=True)

    def __enter__(self) -> PowerSampler:
        self.sample_now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample_now()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_now()

    def sample_now(self) -> None:
        """Take one sample now (the bench calls it at phase boundaries for sharp edges)."""
        with self.lock:
            self.peak_rss = max(self.peak_rss, self._process.memory_info().rss)
            if self.lost is not None:
                return
            try:
                reading = self.meter.read()
            except MeterUnavailable as exc:
                self.lost, self.lost_at = str(exc), time.monotonic()
                return
            if reading.watts is not None:
                self.samples.append((reading.t, reading.watts))
            elif reading.joules is not None:
                if self._last_energy is not None:
                    t0, j0 = self._last_energy
                    if reading.t > t0:
                        self.samples.append((reading.t, (reading.joules - j0) / (reading.t - t0)))
                self._last_energy = (reading.t, reading.joules)

    def window(self, t0: float, t1: float) -> PowerWindow:
        """Power over [t0, t1]: average and peak of the samples in it, energy integrated
        (trapezoids; the samples just outside bound the edges)."""
        with self.lock:
            inside = [(t, w) for t, w in self.samples if t0 <= t <= t1]
            before = [(t, w) for t, w in self.samples if t < t0][-1:]
            after = [(t, w) for t, w in self.samples if t > t1][:1]
        complete = self.lost_at is None or self.lost_at > t1
        points = before + inside + after
        if len(points) < 2:
            only = points[0][1] if points else None
            return PowerWindow(
                avg_w=only,
                peak_w=only,
                joules=only * (t1 - t0) if only is not None else None,
                samples=len(inside),
                complete=complete and bool(points),
            )
        joules = 0.0
        for (ta, wa), (tb, wb) in zip(points, points[1:], strict=False):
            lo, hi = max(ta, t0), min(tb, t1)
            if hi > lo:
                joules += (hi - lo) * (wa + wb) / 2
        # The edge samples shape the integral, so they count for the peak too.
        watts = [w for _, w in points]
        return PowerWindow(
            avg_w=joules / (t1 - t0) if t1 > t0 else watts[0],
            peak_w=max(watts),
            joules=joules,
            samples=len(inside),
            complete=complete,
        )
