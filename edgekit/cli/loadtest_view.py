"""What ``edgekit loadtest`` and the TUI's Load tab share: lists of numbers typed as text,
and a run as a title, one row of cells a level, and notes (so both show the same figures,
formatted the same way)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgekit.errors import ServeError

if TYPE_CHECKING:  # every `edgekit` command imports this module: the CLI starts light
    from edgekit.loadtest_stats import LevelResult, LoadTestResult, Spread

COLUMNS = ("level", "ok", "err", "req/s", "out tok/s", "TTFT ms", "ITL ms", "E2E s", "J/token")
CAPTION = (
    "p50 / p95 / p99; out tok/s: all clients together; J/token from the server's /metrics "
    "(est.: an estimate, not a sensor)"
)


def numbers(flag: str, text: str | None, kind: type[int] | type[float]) -> tuple[Any, ...]:
    """``text`` as numbers separated by commas (empty: none); ``flag`` names the field.

    Raises:
        ServeError: a part that is not a number of ``kind``.
    """
    if not text:
        return ()
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ServeError(
            f"{flag} {text!r} is not a list of numbers",
            hint=f"pass numbers separated by commas, such as {flag} 1,2,4",
        ) from None


def _ms(spread: Spread) -> str:
    if spread.n == 0 or spread.p50 is None or spread.p95 is None or spread.p99 is None:
        return "-"
    return f"{spread.p50 * 1e3:.0f} / {spread.p95 * 1e3:.0f} / {spread.p99 * 1e3:.0f}"


def _s(spread: Spread) -> str:
    if spread.n == 0 or spread.p50 is None or spread.p95 is None or spread.p99 is None:
        return "-"
    return f"{spread.p50:.2f} / {spread.p95:.2f} / {spread.p99:.2f}"


def _energy(level: LevelResult) -> str:
    e = level.energy
    if e is None or e.joules_per_token is None:
        return "-"
    mark = "" if e.measured else " (est.)"
    return f"{e.joules_per_token:.3f}{mark}"


def level_cells(level: LevelResult) -> tuple[str, ...]:
    """``level`` as the cells of COLUMNS."""
    return (
        level.label(),
        str(level.ok),
        str(level.errors),
        f"{level.requests_per_s:.2f}",
        f"{level.output_tokens_per_s:.1f}",
        _ms(level.ttft_s),
        _ms(level.itl_s),
        _s(level.e2e_s),
        _energy(level),
    )


def title(result: LoadTestResult) -> str:
    """What was loaded, and how (the model's name is the server's: show it as plain text)."""
    return (
        f"{result.url} {result.endpoint}, model {result.model}: prompts of about "
        f"{result.prompt_tokens} tokens, answers up to {result.max_tokens}"
    )


def notes(result: LoadTestResult) -> list[str]:
    """The errors of each level by kind, and the prompt length the server counted (each
    line holds the server's words: show it as plain text)."""
    lines = [
        f"{level.label()}: {n} x {kind}"
        for level in result.levels
        for kind, n in level.error_kinds.items()
    ]
    served = [lv.prompt_tokens_mean for lv in result.levels if lv.prompt_tokens_mean is not None]
    if served:
        lines.append(
            f"the server counted {sum(served) / len(served):.0f} prompt tokens a request "
            f"(asked for about {result.prompt_tokens})"
        )
    return lines
