"""Power for ``edgekit serve``'s ``/metrics``: one power meter (edgekit.power) read on a
thread of its own, its figures labelled with where they come from (``sensor``: rapl,
nvml, jetson-ina, powermetrics, battery, or ``estimated``, which is CPU utilisation times
the device's power envelope and is labelled as the estimate it is).

Unlike the benchmark's sampler, which keeps every sample of a run, a server runs for
days: the watch keeps only the last reading and running totals. Energy is integrated
between readings (an energy counter's difference, or trapezoids of power samples). The
part drawn while generations were in flight is the interval's energy times the share of
the interval that had one (``ServeMetrics.busy_seconds``); divided by the tokens
generated it is the energy per token. It covers everything the sensor sees: a RAPL
package includes other programs, and idle power while generating counts too.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

from edgekit.power.base import MeterUnavailable, PowerMeter, Reading
from edgekit.serve_telemetry import ServeMetrics
from edgekit.untrusted import clean_text

log = logging.getLogger("edgekit.serve")

DEFAULT_INTERVAL_S = 1.0


@dataclass(frozen=True, kw_only=True)
class _Last:
    t: float
    watts: float | None
    joules: float | None
    busy: float  # ServeMetrics.busy_seconds at t


class PowerWatch:
    """Reads ``meter`` every ``interval_s`` seconds into ``metrics``' registry (its own
    metrics are added there when it is made). Use it as a context manager around the
    server's run; the meter stays the caller's to close."""

    def __init__(
        self, meter: PowerMeter, metrics: ServeMetrics, *, interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        self.meter = meter
        self.metrics = metrics
        self.interval_s = interval_s
        self.sensor = meter.name
        self.lost: str | None = None
        self._last: _Last | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekit-serve-power", daemon=True)
        r = metrics.registry
        self.watts = r.gauge(
            "edgekit:power_watts",
            "Power drawn over the last sampling interval (sensor=estimated: an estimate from "
            "CPU utilisation and the device's power envelope, not a measurement)",
            ("sensor",),
        )
        self.energy = r.counter(
            "edgekit:energy_joules_total",
            "Energy drawn since the server started, as far as the sensor sees",
            ("sensor",),
        )
        self.busy_energy = r.counter(
            "edgekit:generation_energy_joules_total",
            "Energy drawn while at least one generation was in flight",
            ("sensor",),
        )
        r.gauge(
            "edgekit:joules_per_token",
            "Generation energy per generated token since the server started",
            ("sensor",),
        ).read_from(self._per_token)
        info = r.gauge(
            "edgekit:power_meter_info",
            "The power meter (value 1); measured=false marks an estimate",
            ("sensor", "measured", "detail"),
        )
        info.set(1, self.sensor, "true" if meter.measured else "false", meter.detail)

    def __enter__(self) -> PowerWatch:
        self.tick()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while self.lost is None and not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """Take one reading and add the energy since the one before (tests call it)."""
        if self.lost is not None:
            return
        try:
            reading = self.meter.read()
        except MeterUnavailable as exc:
            self.lost = str(exc)
            self.watts.set(math.nan, self.sensor)
            log.warning("power readings stopped: %s", clean_text(exc, max_len=300))
            return
        self._add(reading)

    def _add(self, reading: Reading) -> None:
        busy = self.metrics.busy_seconds(reading.t)
        last, self._last = (
            self._last,
            _Last(t=reading.t, watts=reading.watts, joules=reading.joules, busy=busy),
        )
        if last is None or reading.t <= last.t:
            if reading.watts is not None:
                self.watts.set(reading.watts, self.sensor)
            return
        span = reading.t - last.t
        if reading.joules is not None and last.joules is not None:
            joules = reading.joules - last.joules
            watts = joules / span
        elif reading.watts is not None:
            before = last.watts if last.watts is not None else reading.watts
            joules = (before + reading.watts) / 2 * span
            watts = reading.watts
        else:
            return
        if not joules >= 0:  # a counter that went back (a reset): this interval is unknown
            return
        share = min(1.0, max(0.0, (busy - last.busy) / span))
        self.energy.inc(joules, self.sensor)
        self.busy_energy.inc(joules * share, self.sensor)
        self.watts.set(watts, self.sensor)

    def _per_token(self) -> dict[tuple[str, ...], float]:
        tokens = self.metrics.predicted.value()
        joules = self.busy_energy.value(self.sensor)
        return {(self.sensor,): joules / tokens if tokens else math.nan}
