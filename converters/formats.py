"""The contract a format package implements (``edgekit.converters.<format>``).

A format is what a bundle variant holds on disk (a GGUF file, an OpenVINO IR folder,
...). Its package owns everything about it: the quantizations it offers with their bits
per weight and expected quality loss, the per-tensor layout rules that size it, the
file a target loads inside a variant folder, and the conversion edges that build it
(``edges``: from which source kind to which output, by which function). The conversion
graph (``edgekit.converters.graph``) joins the edges of every registered format into
routes, so "GGUF Q4_1 -> HF -> OpenVINO INT4" is a route, not a branch in ``pack``.

A format package imports no SDK at import time; an edge names the modules it needs
(``tools``) and imports them when it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from edgekit.errors import ConversionError, UnsupportedConversionError
from edgekit.progress import ProgressCallback

if TYPE_CHECKING:
    from edgekit.converters.layouts import WeightLayout
    from edgekit.converters.recipe import Recipe

    from edgekit.modelspec import ModelSpec
    from edgekit.tool_envs import ToolEnv

# Source kinds: what ``inspect_model`` reports as ModelSpec.format ("hf", "gguf"), and
# the formats an edge can write ("hf" is the dequantized Hugging Face folder).
SourceKind = str


@dataclass(frozen=True, kw_only=True)
class Quant:
    """One quantization of a format."""

    name: str  # upper case: "Q4_K_M", "INT4", "4BIT"...
    bits_per_weight: float  # nominal: ranks quality (more bits, less loss) and sizes
    # expected mean KL against the source (nats/token) and where that figure comes from
    expected_kl: float | None = None
    kl_source: str = "no measurement"
    note: str = ""
    lossless: bool = False  # a float format: converting to it loses nothing


@dataclass(frozen=True, kw_only=True)
class ConvertRequest:
    """One conversion step, with checked options.

    A check of a step whose source an earlier step of the route writes gets the route's
    source (``src``, ``spec``: the same model); it checks what it can before that file
    exists, and the step is checked again on the real file before it runs."""

    src: Path
    out: Path | None  # None in a check made before the destination is chosen
    spec: ModelSpec
    quant: str | None  # None for an edge whose output has no quantization (-> hf)
    recipe: Recipe | None
    tokenizer_pre: str | None = None
    threads: int | None = None
    # the context the variant is built for: a format whose KV cache is static (an HTP
    # context binary) sizes it to this; None: the format's default
    context: int | None = None
    force: bool = False
    progress: ProgressCallback

    def destination(self) -> Path:
        """Where the step writes.

        Raises:
            ConversionError: the request is a check's, made without a destination.
        """
        if self.out is None:
            raise ConversionError(f"no destination given for converting {self.src}")
        return self.out


@dataclass(frozen=True, kw_only=True)
class Edge:
    """A conversion from one source kind to one output, with its checks."""

    source: SourceKind
    output: SourceKind  # a format name, or "hf"
    # everything knowable before writing: options, source, installed tools
    # (raises UnsupportedConversionError / TargetUnavailableError)
    check: Callable[[ConvertRequest], None]
    # runs the conversion; returns its warnings
    run: Callable[[ConvertRequest], tuple[str, ...]]
    describe: str  # one line for docs and --json: "HF folder -> GGUF (llama.cpp quantizer)"
    # the distributions it runs ("gguf", "llama-cpp-python"): a bundle's provenance
    # records their versions
    tools: tuple[str, ...] = ()


class Format(ABC):
    """A bundle format. Subclass it once in the format's package and expose an instance
    as ``FORMAT``; the targets that load it name that instance."""

    name: ClassVar[str]  # "gguf": the variant folder prefix and ``convert --to`` name
    display: ClassVar[str]
    entry: ClassVar[str]  # the file a target loads inside a variant folder ("" = the folder)
    default_quant: ClassVar[str]  # what ``edgekit convert --to`` writes when none is named
    # what ``edgekit pack`` builds when none is named ("": default_quant)
    pack_quant: ClassVar[str] = ""
    quants: ClassVar[Mapping[str, Quant]]
    # False: edgekit sizes and predicts it (plan) but cannot build it yet (no edges)
    buildable: ClassVar[bool] = True
    # The tool that requantizes a source already in this format, copying every tensor that
    # already has the type it would choose ("" when a conversion rewrites every tensor):
    # such a source kept in its own quantization loses nothing more.
    requantizer: ClassVar[str] = ""
    # The isolated tool environments its conversions run in (an exporter whose pins
    # conflict with edgekit's own environment): ``edgekit tools install NAME`` creates them,
    # and the CLI lists them from here, so nothing outside the format names them.
    tool_envs: ClassVar[tuple[ToolEnv, ...]] = ()

    def quant(self, name: str) -> Quant | None:
        return self.quants.get(name.upper())

    def pack_default(self) -> str:
        """The quantization ``edgekit pack`` builds when none is named."""
        return self.pack_quant or self.default_quant

    def require_quant(self, name: str) -> Quant:
        """The quantization ``name`` (any case).

        Raises:
            UnsupportedConversionError: this format has no such quantization (the hint
                lists those it has).
        """
        found = self.quant(name)
        if found is None:
            raise UnsupportedConversionError(
                f"{self.display} has no format {name!r}",
                hint=f"choose one of {', '.join(q.name for q in self.quants.values())}",
            )
        return found

    @abstractmethod
    def layout(self, spec: ModelSpec, quant: str, *, group_size: int | None = None) -> WeightLayout:
        """What ``spec`` weighs in this format: every tensor's storage and bytes, from the
        tensor list alone (a config is enough).

        Raises:
            UnsupportedConversionError: ``quant`` is not one of this format's.
        """

    def built_layout(self, spec: ModelSpec, quant: str) -> WeightLayout:
        """The layout of a variant already built in this format (``spec`` describes its
        file); by default the planned layout of the same quantization."""
        return self.layout(spec, quant)

    def cannot_build(self, spec: ModelSpec) -> str:
        """Why edgekit's converter cannot build ``spec`` in this buildable format ("" when
        it can: e.g. a family the exporter does not support yet). The planner marks such a
        candidate prediction-only; no tool is imported."""
        return ""

    def quant_not_built(self, quant: str) -> str:
        """Why edgekit does not build the quantization ``quant`` of this buildable format
        ("" when it does: e.g. one that needs a calibration on hardware this host lacks).
        The planner marks such a candidate prediction-only."""
        return ""

    def edges(self) -> tuple[Edge, ...]:
        """The conversions this package performs (none for a format edgekit cannot build)."""
        return ()
