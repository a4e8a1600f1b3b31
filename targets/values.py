"""The values a Session takes and gives: sampling parameters, streamed chunks, finished
generations and what a loaded session is.

``Sampling`` checks every field when it is made (SettingError with the valid range), so a
Sampling that exists is one every runtime can take.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from edgekit.targets import checks

from edgekit.errors import SettingError

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to pick tokens. ``temperature == 0`` is greedy decoding; ``top_k == 0`` turns
    top-k off; ``seed`` (0 to 2**32 - 2) makes sampling repeatable for this call only.

    Every field is checked here (SettingError with the valid range), so a Sampling that
    exists is one every runtime can take."""

    max_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # generate max_tokens even past end-of-sequence (benchmarks)

    def __post_init__(self) -> None:
        checked: dict[str, Any] = {
            "max_tokens": checks.integer("max_tokens", self.max_tokens, low=1),
            "temperature": checks.number(
                "temperature", self.temperature, low=0.0, high=checks.MAX_TEMPERATURE
            ),
            "top_p": checks.number("top_p", self.top_p, low=0.0, high=1.0, low_open=True),
            "top_k": checks.integer("top_k", self.top_k, low=0, note="0: off"),
            "min_p": checks.number("min_p", self.min_p, low=0.0, high=1.0),
            "repeat_penalty": checks.number(
                "repeat_penalty",
                self.repeat_penalty,
                low=0.0,
                high=checks.MAX_REPEAT_PENALTY,
                low_open=True,
            ),
            "seed": None
            if self.seed is None
            else checks.integer("seed", self.seed, low=0, high=checks.MAX_SEED),
            "stop": checks.stop_strings(self.stop),
            "ignore_eos": checks.flag("ignore_eos", self.ignore_eos),
        }
        for name, value in checked.items():  # the canonical types: int, float, tuple
            object.__setattr__(self, name, value)


SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling))


def sampling_from(base: Sampling | None, overrides: dict[str, Any]) -> Sampling:
    """``base`` (or the defaults) with keyword ``overrides``, every one checked.

    Raises:
        SettingError: ``base`` is not a Sampling, an override is unknown or out of range.
    """
    if base is not None and not isinstance(base, Sampling):
        raise SettingError(
            f"sampling must be a Sampling (or None), not {type(base).__name__}",
            hint="pass Sampling(...) or keyword arguments such as max_tokens=64",
        )
    checks.known_settings(overrides, SAMPLING_FIELDS, what="sampling parameter")
    s = base or Sampling()
    return replace(s, **overrides) if overrides else s


@dataclass(frozen=True, kw_only=True)
class StreamChunk:
    """A piece of generated text and how many tokens produced it."""

    text: str
    tokens: int
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, kw_only=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    target: str
    model_path: str
    context_length: int
    threads: int
    kv_cache: str
    settings: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None  # token ids are 0 to vocab_size - 1 (None: not known)
    # the kind of compute unit the model runs on, as the planner names units (bench files
    # its calibration sample under it)
    unit: str = "cpu"
