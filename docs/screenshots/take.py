"""Screenshots of every TUI tab, taken from the real app on this host (for the README).

    python docs/screenshots/take.py [BUNDLE]

Packs the embedded default model for this host when no BUNDLE is given, probes the host,
plans, runs the Bench tab's benchmark, compares the saved results and chats, and writes
one SVG per tab next to this file. Nothing is faked: the figures are this machine's.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from edgekit.tui.app import EdgekitApp
from edgekit.tui.bench import BenchPane
from edgekit.tui.chat import ChatPane
from edgekit.tui.sources import Sources
from textual.widgets import TabbedContent

from edgekit.bundle import VariantRequest, pack
from edgekit.default_model import default_model_path

HERE = Path(__file__).parent
SIZE = (120, 40)


async def settle(app: EdgekitApp, pilot: object, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    await pilot.pause(0.5)  # type: ignore[attr-defined]
    while any(w.is_running for w in app.workers) and time.monotonic() < end:
        await pilot.pause(0.2)  # type: ignore[attr-defined]
    await pilot.pause(0.5)  # type: ignore[attr-defined]


async def take(bundle: Path, results: Path) -> None:
    app = EdgekitApp(Sources(bundle=bundle, model=default_model_path(), results=results))
    async with app.run_test(size=SIZE) as pilot:
        tabs = app.query_one(TabbedContent)
        for tab in ("device", "plan", "bench", "compare"):
            tabs.active = tab
            if tab == "bench":
                app.query_one(BenchPane).action_run()
            await settle(app, pilot)
            app.save_screenshot(f"{tab}.svg", path=str(HERE))
        tabs.active = "chat"
        await pilot.pause(0.3)
        chat = app.query_one("#chat-input")
        chat.cursor_blink = False  # type: ignore[attr-defined]
        await pilot.press(*"Name three things to see in Paris.", "enter")
        pane = app.query_one(ChatPane)
        end = time.monotonic() + 300
        while (pane._generating or len(pane.messages) < 2) and time.monotonic() < end:
            await pilot.pause(0.2)
        await pilot.pause(0.5)
        app.save_screenshot("chat.svg", path=str(HERE))


def main(argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if argv:
            bundle = Path(argv[0])
        else:
            bundle = Path(tmp) / "smollm2"
            pack(
                default_model_path(),
                bundle,
                [VariantRequest(quant="Q4_K_M"), VariantRequest(target="openvino", quant="INT4")],
            )
        asyncio.run(take(bundle, Path(tmp) / "results"))


if __name__ == "__main__":
    main(sys.argv[1:])
