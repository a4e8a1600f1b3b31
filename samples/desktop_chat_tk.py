"""Embed edgekit in a desktop app: a small Tk chat window that streams from a Session.

    python samples/desktop_chat_tk.py my.bundle

The model runs on a worker thread; pieces of text travel to the Tk thread through a
queue that the window polls, so the window never freezes. "Stop" cancels the reply in
progress (Session.cancel works from any thread). ChatController holds all the logic and
needs no display, so it can be tested headless.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any


class ChatController:
    """Chat history and streaming, independent of any UI toolkit."""

    def __init__(self, session: Any, max_tokens: int = 256) -> None:
        self.session = session
        self.max_tokens = max_tokens
        self.history: list[dict[str, str]] = []
        self.events: queue.Queue[tuple[str, str]] = queue.Queue()  # ("text" | "done", payload)
        self._worker: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def send(self, text: str) -> bool:
        """Start a reply to ``text``; False if one is still running or the text is empty."""
        if self.busy or not text.strip():
            return False
        self.history.append({"role": "user", "content": text})
        self._worker = threading.Thread(target=self._reply, daemon=True)
        self._worker.start()
        return True

    def stop(self) -> None:
        self.session.cancel()

    def wait(self, timeout: float | None = None) -> None:
        if self._worker is not None:
            self._worker.join(timeout)

    def _reply(self) -> None:
        pieces: list[str] = []
        reason = "stop"
        try:
            for chunk in self.session.chat_stream(
                self.history, max_tokens=self.max_tokens, temperature=0.7
            ):
                pieces.append(chunk.text)
                self.events.put(("text", chunk.text))
                reason = chunk.finish_reason or reason
        except Exception as exc:  # shown in the window, not lost on a thread
            reason = f"error: {exc}"
        self.history.append({"role": "assistant", "content": "".join(pieces)})
        self.events.put(("done", reason))


def run_window(controller: ChatController) -> None:
    import tkinter as tk
    from tkinter import scrolledtext

    root = tk.Tk()
    root.title("edgekit chat")
    log = scrolledtext.ScrolledText(root, wrap="word", state="disabled", height=24, width=80)
    log.pack(fill="both", expand=True)
    entry = tk.Entry(root)
    entry.pack(fill="x", side="left", expand=True)

    def append(text: str) -> None:
        log.configure(state="normal")
        log.insert("end", text)
        log.see("end")
        log.configure(state="disabled")

    def send(_event: object = None) -> None:
        text = entry.get()
        if controller.send(text):
            entry.delete(0, "end")
            append(f"\nyou: {text}\nmodel: ")

    def poll() -> None:
        while not controller.events.empty():
            kind, payload = controller.events.get_nowait()
            append(payload if kind == "text" else f"  [{payload}]\n")
        root.after(30, poll)

    tk.Button(root, text="Send", command=send).pack(side="left")
    tk.Button(root, text="Stop", command=controller.stop).pack(side="left")
    entry.bind("<Return>", send)
    root.after(30, poll)
    root.mainloop()


def main() -> None:
    import edgekit

    bundle = sys.argv[1] if len(sys.argv) > 1 else None
    if bundle is None:
        print("usage: python samples/desktop_chat_tk.py BUNDLE (make one with `edgekit pack`)")
        raise SystemExit(2)
    with edgekit.load(bundle) as session:
        run_window(ChatController(session))


if __name__ == "__main__":
    main()
