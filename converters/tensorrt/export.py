"""Hugging Face folder -> TensorRT Edge-LLM variant, through NVIDIA's exporter.

``tensorrt-edgellm-export SRC OUT`` runs in a subprocess from the isolated tool
environment (``tool_env``): its pins cannot live in edgekit's environment. Every source
is given as a staging folder of the checked files (``staging``: the exporter trusts
remote code; an f32 source is cast to f16 there), with the Hub switched off. The
exporter's output (stdout and stderr) goes to a log in the conversion's private folder
and to edgekit's debug log; its known milestones become progress events; a failure
becomes one ConversionError that quotes the exporter's exception summary, not its
traceback. The output is then read back as an untrusted folder (``folder.read_export``:
regular files, bounded sizes, strict config.json) and compared with the source's
dimensions before engine.json is written and the folder is published atomically.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from edgekit.converters.edge_checks import hf_side_files
from edgekit.converters.tensorrt.folder import check_matches, read_export
from edgekit.converters.tensorrt.settings import ENGINE_JSON, EngineSettings
from edgekit.converters.tensorrt.staging import check_dtypes, needs_staging, stage_f16
from edgekit.converters.tensorrt.tool_env import EXPORT_ENV, EXPORT_SCRIPT

from edgekit.atomic import atomic_path, check_destination, open_new
from edgekit.errors import ConversionError, EdgekitError
from edgekit.modelspec import ModelSpec
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safe_files import kind_of
from edgekit.tool_envs import locate, run_script
from edgekit.untrusted import clean_text

log = logging.getLogger(__name__)

LOG_NAME = "export.log"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# exporter log lines that mark its progress, in order (0.11.0's wording)
MILESTONES = (
    ("Loading checkpoint", "loading the checkpoint"),
    ("Exporting ONNX", "tracing the model"),
    ("Translate the graph into ONNX...", "translating to ONNX"),
    ("Optimize the ONNX graph", "optimizing the graph"),
    ("Export complete", "export complete"),
)
_STEPS = len(MILESTONES) + 2  # + staging, + checking the output


@dataclass(frozen=True, kw_only=True)
class TensorRtResult:
    path: Path
    settings: EngineSettings
    staged: bool  # the source was cast to f16 first
    warnings: tuple[str, ...]


def hf_to_tensorrt(
    src: Path,
    out: Path,
    settings: EngineSettings,
    spec: ModelSpec,
    *,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> TensorRtResult:
    """Export the Hugging Face folder ``src`` (described by ``spec``) into the variant
    folder ``out`` with ``settings`` (checked by ``settings_from_recipe``), atomically.

    Raises:
        OutputExistsError: ``out`` exists and ``force`` is not set.
        TargetUnavailableError: the export tool environment is not installed.
        ConversionError: the exporter failed (its exception summary is quoted), or wrote
            a folder that disagrees with the source; nothing is left at ``out``.
    """
    check_destination(out, force=force)
    locate(EXPORT_ENV)  # before any work: the hint says how to install it
    hf_side_files(src)
    check_dtypes(src)  # a source an earlier step wrote is checked here
    with atomic_path(out, force=force) as tmp:
        # the private folder beside ``out``: the staging copy and the log live and die
        # with it (only ``tmp`` is published)
        work = tmp.parent
        # always a staging folder: the exporter trusts remote code and reaches for the
        # Hub (staging.py); only what edgekit checked goes in
        staged = needs_staging(src)
        detail = "casting to f16" if staged else "staging the checked files"
        progress(ProgressEvent(stage="export", done=0, total=_STEPS, detail=detail))
        given = stage_f16(src, work / "staging")
        _run_exporter(given, tmp, work, progress, source_name=src.name)
        progress(ProgressEvent(stage="export", done=_STEPS - 1, total=_STEPS, detail="checking"))
        try:
            # a new file, never through a link: the exporter's folder is not trusted
            with open_new(tmp / ENGINE_JSON) as f:
                f.write(json.dumps(settings.to_json(), indent=2).encode("utf-8"))
            folder = read_export(tmp)
            check_matches(folder, spec)
        except EdgekitError as exc:
            raise ConversionError(
                f"the Edge-LLM exporter wrote an export edgekit cannot use: {exc.message}",
                hint="report it with the exporter's version; the export was not kept",
            ) from exc
        progress(ProgressEvent(stage="export", done=_STEPS, total=_STEPS, detail="written"))
    return TensorRtResult(path=out, settings=settings, staged=staged, warnings=())


def offline_env(work: Path) -> dict[str, str]:
    """The variables that keep the exporter off the network: it downloads from the Hub
    for names it does not find as folders. Its caches live in ``work``."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(work / "hf-home"),
    }


def _run_exporter(
    src: Path, out: Path, work: Path, progress: ProgressCallback, *, source_name: str
) -> None:
    """Run the exporter from ``src`` (the staging folder of the user's ``source_name``)
    into ``out``, in ``work`` (its log, its caches).

    Raises:
        ConversionError: it exited non-zero, or wrote no llm/ folder.
    """
    reached = [0]

    def on_line(line: str) -> None:
        log.debug("exporter: %s", clean_text(line, max_len=500))
        for i, (marker, detail) in enumerate(MILESTONES):
            if i >= reached[0] and marker in line:
                reached[0] = i + 1
                progress(ProgressEvent(stage="export", done=i + 1, total=_STEPS, detail=detail))

    code, tail = run_script(
        EXPORT_ENV,
        EXPORT_SCRIPT,
        [str(src), str(out)],
        log_path=work / LOG_NAME,
        on_line=on_line,
        cwd=work,
        extra_env=offline_env(work),
    )
    if code != 0:
        raise ConversionError(
            f"the Edge-LLM exporter failed on {source_name}: {failure_summary(tail)}",
            hint="run with -vv to see the exporter's output",
        )
    kind = _kind(out)
    if kind != "a folder":  # a link would publish whatever folder it names
        raise ConversionError(
            f"the Edge-LLM exporter's output {out.name} is {kind}, not a folder",
            hint="report it with the exporter's version; the export was not kept",
        )
    if not (out / "llm").is_dir():
        raise ConversionError(
            f"the Edge-LLM exporter wrote no llm/ folder for {source_name}",
            hint="run with -vv to see the exporter's output",
        )


def _kind(path: Path) -> str:
    try:
        return kind_of(os.lstat(path).st_mode)
    except FileNotFoundError:
        return "missing"


def failure_summary(tail: deque[str] | list[str]) -> str:
    """The one line that says why the exporter failed: the line after its
    "## Exception summary" heading, else the last "SomethingError: ..." line, else the
    last non-empty line."""
    lines = [_ANSI.sub("", t).strip() for t in tail]
    for i, line in enumerate(lines):
        if line.startswith("## Exception summary"):
            after = next((x for x in lines[i + 1 :] if x), "")
            if after:
                return clean_text(after, max_len=300)
    errors = [x for x in lines if re.match(r"^[\w.<>' ]*(Error|Exception)\b.*:", x)]
    if errors:
        return clean_text(errors[-1], max_len=300)
    last = next((x for x in reversed(lines) if x), "no output")
    return clean_text(last, max_len=300)
