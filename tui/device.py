"""Device tab: the host probe (CPU, memory, accelerators, power sensors, targets) and the
device profile the plan is made for."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from edgekit.tui.shown import cell, content
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Label, Select, Static

from edgekit.devices import profile_names
from edgekit.probe import HostReport

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp


class DevicePane(Vertical):
    def compose(self) -> ComposeResult:
        names = profile_names()
        device = self.edgekit.sources.device
        with Horizontal(id="device-choice"):
            yield Label("Plan for: ")
            yield Select(
                [("this host (probed)", "host")] + [(n, n) for n in names],
                value=device if device in names else "host",
                allow_blank=False,
                id="device-select",
            )
        yield Static("probing this host...", id="host-summary")
        yield DataTable(id="units", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="sensors", cursor_type="row", zebra_stripes=True)

    @property
    def edgekit(self) -> EdgekitApp:
        return cast("EdgekitApp", self.app)

    def on_mount(self) -> None:
        self.probe()

    @work(thread=True, exclusive=True, group="probe")
    def probe(self) -> None:
        try:
            report = self.edgekit.sources.probe()
        except Exception as exc:  # the probe reports per part; anything else is shown
            self.app.call_from_thread(self.edgekit.report, exc, title="probe")
            return
        self.app.call_from_thread(self.show, report)

    def show(self, report: HostReport) -> None:
        p = report.profile
        mem = p.memory
        bandwidth = (
            f"{mem.bandwidth_gbps:g} GB/s ({mem.bandwidth_source})"
            if mem.bandwidth_gbps
            else "not measured (edgekit probe --measure)"
        )
        # the probe reads names from the host (/proc, sysfs, drivers) and a profile is a
        # file: every one is inserted as plain text
        self.query_one("#host-summary", Static).update(
            content(
                "[b]$display[/b]  $kind, $os $arch\n"
                "CPU: $cpu, $cores cores / $threads threads, ISA $isa\n"
                "Memory: $memory\nPower envelope: $power",
                display=p.display_name,
                kind=p.kind,
                os=p.os,
                arch=p.arch,
                cpu=p.cpu.model,
                cores=p.cpu.physical_cores,
                threads=p.cpu.logical_cores,
                isa=" ".join(p.cpu.isa) or "-",
                memory=f"{mem.total_gib:.1f} GiB total, {mem.available_gib or 0:.1f} GiB "
                f"available, {mem.usable_gib:.1f} GiB usable for a model; bandwidth {bandwidth}",
                power=f"idle {p.power.idle_w:g} W, typical {p.power.typical_w:g} W, max "
                f"{p.power.max_w:g} W ({p.power.source})",
            )
        )
        units = self.query_one("#units", DataTable)
        units.clear(columns=True)
        units.add_columns("unit", "name", "peak", "memory", "runtime device")
        for a in p.accelerators:
            peak = ", ".join(f"{k} {v:g} T" for k, v in a.peak_tops.items()) or "-"
            memory = (
                f"{a.memory_gib:g} GiB" if a.memory_gib else f"shared ({mem.total_gib:.0f} GiB)"
            )
            units.add_row(
                cell(a.kind), cell(a.name), cell(peak), memory, cell(a.runtime_device or "-")
            )
        for t in report.targets:
            state = "usable" if t.usable else "not usable"
            units.add_row(
                "target", cell(t.name), cell(t.version or "-"), state, cell(t.detail, max_len=60)
            )
        sensors = self.query_one("#sensors", DataTable)
        sensors.clear(columns=True)
        sensors.add_columns("power sensor", "watts are", "detail")
        for s in report.sensors:
            state = "measured" if s.readable else "unavailable"
            sensors.add_row(cell(s.name), state, cell(s.detail, max_len=2000))
        if not any(s.readable for s in report.sensors):
            sensors.add_row(
                "estimated",
                "estimated",
                "no readable sensor here: watts shown are estimated from the power envelope",
            )

    def on_select_changed(self, event: Select.Changed) -> None:
        value = event.value
        if (
            event.select.id == "device-select"
            and isinstance(value, str)
            and value != self.edgekit.sources.device
        ):
            self.edgekit.device_changed(value)
