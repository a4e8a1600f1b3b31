"""Chat tab: stream from the loaded bundle, with tokens/s as it streams; Escape stops."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from edgekit.tui.shown import content, plain
from edgekit.tui.workers import background, report_failure
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Input, RichLog, Static
from textual.worker import Worker

from edgekit.terminal_text import OutputCleaner, clean_output

if TYPE_CHECKING:
    from edgekit.tui.app import EdgekitApp

MAX_TOKENS = 256


class ChatPane(Vertical):
    BINDINGS = [Binding("escape", "cancel", "Stop generating")]

    def __init__(self) -> None:
        super().__init__()
        self.session: Any = None
        self.messages: list[dict[str, str]] = []
        self.reply = ""  # what the model said, kept as it is for the history
        self.shown = ""  # the same without escape sequences and control characters
        self._cleaner = OutputCleaner()
        self.speed = ""
        self._generating = False
        self._generation: Any = None  # the reply being generated: its own handle

    @property
    def edgekit(self) -> EdgekitApp:
        return cast("EdgekitApp", self.app)

    def compose(self) -> ComposeResult:
        yield Static("", id="chat-status")
        yield RichLog(id="chat-log", wrap=True, markup=False)  # lines are Text, never markup
        yield Static("", id="chat-reply")
        yield Input(placeholder="Type a message and press enter", id="chat-input")

    def on_mount(self) -> None:
        self.show_bundle()

    def show_bundle(self) -> None:
        bundle = self.edgekit.sources.bundle
        if self.session is not None:
            self._close_session()
            self.session = None
        self.query_one("#chat-status", Static).update(
            content("bundle: $bundle (loaded on the first message)", bundle=bundle)
            if bundle
            else plain("No bundle: start `edgekit tui BUNDLE`, or pack one on the Bench tab.")
        )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or self._generating:
            return
        if self.edgekit.sources.bundle is None:
            self.edgekit.say(
                "no bundle to chat with: pack one on the Bench tab", severity="warning"
            )
            return
        event.input.value = ""
        self.messages.append({"role": "user", "content": text})
        self.query_one("#chat-log", RichLog).write(_said("you", clean_output(text)))
        self._generating = True
        self.reply = ""
        self.shown = ""
        self._cleaner = OutputCleaner()
        self.generate(list(self.messages))

    def action_cancel(self) -> None:
        """Escape: stop this reply (its own generation) at its next token."""
        if self._generating and self._generation is not None:
            self._generation.cancel()

    @background("chat")
    def generate(self, messages: list[dict[str, str]]) -> None:
        import edgekit

        clock = self.edgekit.sources.clock
        if self.session is None:
            self.app.call_from_thread(self.status, "loading the model...")
            self.session = edgekit.load(self.edgekit.sources.bundle)  # type: ignore[arg-type]
            self.app.call_from_thread(
                self.status,
                f"{self.session.variant.name if self.session.variant else ''} "
                f"({self.session.info.target})",
            )  # a variant's name from the manifest: status() shows it as plain text
        start: float | None = None
        tokens = 0
        generation = self.session.chat_stream(messages, max_tokens=MAX_TOKENS, temperature=0)
        self._generation = generation
        try:
            for chunk in generation:
                now = clock()
                if chunk.tokens:
                    if start is None:
                        start = now
                    tokens += chunk.tokens
                rate = (tokens - 1) / (now - start) if start is not None and now > start else None
                self.app.call_from_thread(
                    self.stream, chunk.text, tokens, rate, chunk.finish_reason
                )
        finally:
            generation.close()  # gives the session back at once, however this ends
        self.app.call_from_thread(self.done)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A failed reply (anything the load or the runtime raised) is a notification;
        the chat is ready for the next message."""
        if report_failure(self.edgekit, event) == "chat":
            self.done()

    def status(self, text: str) -> None:
        self.query_one("#chat-status", Static).update(plain(text))

    def stream(self, text: str, tokens: int, rate: float | None, finish: str | None) -> None:
        self.reply += text
        # the reply is the model's content: its line breaks stay, markup is never read,
        # escape sequences go (one split across chunks waits for its end in the cleaner)
        self.shown += self._cleaner.feed(text)
        speed = f"{rate:.1f} tok/s" if rate else "..."
        end = f" ({finish})" if finish else ""
        self.speed = f"{tokens} tokens, {speed}{end}"
        self.query_one("#chat-reply", Static).update(
            Content.assemble(("model", "bold"), " ", self.shown, "\n", (self.speed, "dim"))
        )

    def done(self) -> None:
        """The reply moves into the transcript; its speed stays below it."""
        self._generation = None
        self.shown += self._cleaner.flush()
        if self.reply:
            self.messages.append({"role": "assistant", "content": self.reply})
            self.query_one("#chat-log", RichLog).write(_said("model", self.shown))
        self.query_one("#chat-reply", Static).update(
            content("[dim]last reply: $speed[/dim]", speed=self.speed) if self.reply else plain("")
        )
        self._generating = False

    def on_unmount(self) -> None:
        if self.session is not None:
            self._close_session()

    def _close_session(self) -> None:
        """A reply still streaming ends first (at once), so closing does not wait for it."""
        generation = self._generation
        if generation is not None:
            generation.close()
        self.session.close()


def _said(who: str, text: str) -> Text:
    """A transcript line: who in bold, then the text as it is (already cleaned), never
    read as markup."""
    return Text.assemble((who, "bold"), " ", text)
