"""QDQ-stage HTP variant -> context-stage variant: every part's prompt and token graphs
compiled on this x86_64 host into QNN HTP context binaries (EPContext models) for one
Snapdragon SoC, with onnxruntime-qnn.

The QDQ folder is the builder's output (docs/onnx.md, "The Qualcomm HTP variant"); only its
``genai_config.json`` and ``edgekit.json`` say what is in it, and both are read as hostile
input before anything is compiled or written: sizes bounded, strict JSON, the pipeline's
stages exactly ``embeddings`` + ``part{i}_prompt`` / ``part{i}_token`` for the parts
edgekit.json counts, each file a plain name of a regular file in the folder (no path, no
link), each graph's external data a plain name in the folder, inside its file.

Compile (``compile_variant``): one child process per part
(``htp_compile_worker``, with a timeout: the preparer holds several times the weights
and may abort the process), session options ``ep.context_enable=1``,
``ep.context_embed_mode=0`` (the binary a ``.bin`` beside its wrapper),
``session.disable_cpu_ep_fallback=1`` (every node on the HTP, or the compile fails);
provider options ``backend_type=htp``, ``soc_model``, ``htp_arch``,
``enable_htp_prepare_only=1`` (prepare for the device, do not run here),
``offload_graph_io_quantization=0`` and ``op_affinity`` (a file naming
GroupQueryAttention for the HTP: without it QNN 2.51 leaves the attention off the HTP).
``share=True``: the part's two graphs share one QNN context (``ep.share_ep_contexts``), one
``.bin`` per part holding its weights once; such a binary loads only on the device (this
host's HTP simulator says "Shared weights buffer isn't supported on this platform").
``share=False``: one binary per graph, which also loads on this host's simulator.

The output folder ships: the embeddings graph and its data (CPU), the EPContext wrappers
and ``.bin`` files, the tokenizer and config files, ``genai_config.json`` with the part
stages renamed to the wrappers and given the QNN provider options a device loads them
with (never a path on this host: op_affinity is a compile option only, measured:
the wrappers load and run without it), and ``edgekit.json`` with ``htp.stage="context"``
and the QNN SDK / onnxruntime-qnn versions that compiled it. No QDQ part graph is shipped.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgekit.converters.onnx.export import SETTINGS_FILE
from edgekit.converters.onnx.htp_compile_input import (
    GENAI_CONFIG,
    HINT,
    Graph,
    QdqFolder,
    copy_file,
    read_qdq_folder,
)
from edgekit.converters.onnx.socs import Soc

from edgekit.atomic import atomic_path, work_dir, write_new
from edgekit.errors import ConversionError, TargetUnavailableError
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safe_files import UnsafePathError, split_relative

WORKER = "edgekit.converters.onnx.htp_compile_worker"
PLUGIN = "onnxruntime_qnn"
# a compile is ~1 s here for the tiny model, 152 s for SmolLM2-135M's prompt graph: a base
# for process start-up and a generous allowance per MiB of the part's weights, per graph
BASE_TIMEOUT_S = 300.0
TIMEOUT_S_PER_MIB = 4.0
STDERR_TAIL = 1200
SHARED_WARNING = (
    "the shared context binaries (one per part, weights once) load only on the Snapdragon "
    "they were compiled for: this host's HTP simulator cannot load a shared binary, so the "
    "variant was not run here (share=False compiles one binary per graph, which it can)"
)


def compile_unavailable() -> str:
    """The empty string when onnxruntime-qnn can compile here, else the precise reason."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return f"onnxruntime is not installed ({exc})"
    try:
        import onnxruntime_qnn
    except ImportError as exc:
        return (
            f"{PLUGIN} is not installed: the QNN execution provider compiles HTP context "
            f"binaries ({exc})"
        )
    try:
        library = Path(onnxruntime_qnn.get_library_path())
    except Exception as exc:  # noqa: BLE001 - a broken package is a reason, not a crash
        return f"{PLUGIN}.get_library_path() failed: {exc}"
    if not library.is_file():
        return f"{PLUGIN} names {library}, which is not a file"
    htp = Path(
        getattr(onnxruntime_qnn, "get_qnn_htp_path", lambda: library.with_name("libQnnHtp.so"))()
    )
    if not htp.is_file():
        return f"{PLUGIN} carries no QNN HTP backend ({htp} is not a file)"
    if not hasattr(ort, "register_execution_provider_library"):
        return f"onnxruntime {ort.__version__} cannot load plug-in execution providers"
    return ""


def compile_variant(
    qdq_folder: Path,
    out: Path,
    soc: Soc,
    *,
    share: bool = True,
    progress: ProgressCallback = no_progress,
) -> tuple[str, ...]:
    """Compile the QDQ-stage variant at ``qdq_folder`` for ``soc`` into a context-stage
    variant at ``out`` (see the module text). Returns warnings.

    Raises:
        TargetUnavailableError: onnxruntime-qnn cannot compile here (``compile_unavailable``).
        ModelFormatError: the QDQ folder is not one edgekit's HTP builder writes (checked
            before anything is written).
        OutputExistsError: ``out`` exists.
        ConversionError: a compile failed or timed out (the QNN log's tail in the hint);
            nothing is left at ``out``.
    """
    qdq_folder, out = Path(qdq_folder), Path(out)
    why = compile_unavailable()
    if why:
        raise TargetUnavailableError(
            f"cannot compile QNN HTP context binaries here: {why}",
            hint="pip install 'edgekit[qnn]' (onnxruntime-qnn, on an x86_64 or arm64 host)",
        )
    folder = read_qdq_folder(qdq_folder)
    total = len(folder.parts) + 2
    with atomic_path(out) as tmp, work_dir(out, "tmp") as scratch:
        tmp.mkdir()
        progress(ProgressEvent(stage="compile", done=0, total=total, detail="copying files"))
        for name in (folder.embeddings.filename, *folder.embeddings.data, *folder.copied):
            copy_file(folder.path, name, tmp)
        affinity = scratch / "op_affinity.json"
        write_new(affinity, json.dumps({"op_type": {"GroupQueryAttention": "HTP"}}))
        seconds: dict[str, float] = {}
        for i, pair in enumerate(folder.parts):
            progress(
                ProgressEvent(
                    stage="compile", done=i + 1, total=total, detail=f"part {i} for {soc.name}"
                )
            )
            job = _job(folder, pair, tmp, soc, share=share, affinity=affinity)
            seconds.update(_run_worker(job, scratch, soc, _timeout(pair), f"part {i}"))
        binaries = _check_outputs(folder, tmp)
        write_new(tmp / GENAI_CONFIG, json.dumps(_context_config(folder, soc, share), indent=2))
        write_new(
            tmp / SETTINGS_FILE,
            json.dumps(_context_settings(folder, soc, share, binaries, seconds), indent=2),
        )
        progress(ProgressEvent(stage="compile", done=total, total=total, detail="compiled"))
    return (SHARED_WARNING,) if share else ()


# --- compiling ------------------------------------------------------------------------------


def compile_options(soc: Soc, quant: str) -> dict[str, str]:
    """The QNN provider options a device loads the compiled graphs with (no host path)."""
    options = {
        "backend_type": "htp",
        "soc_model": str(soc.soc_model),
        "htp_arch": str(soc.htp_arch),
        # the graphs take and give the float tensors the genai pipeline passes
        "offload_graph_io_quantization": "0",
    }
    if quant == "FP16":  # a float graph: the HTP runs it at fp16
        options["enable_htp_fp16_precision"] = "1"
    return options


def _job(
    folder: QdqFolder,
    pair: tuple[Graph, Graph],
    tmp: Path,
    soc: Soc,
    *,
    share: bool,
    affinity: Path,
) -> dict[str, Any]:
    options = {
        **compile_options(soc, folder.quant),
        "enable_htp_prepare_only": "1",
        "op_affinity": str(affinity),
    }
    graphs = [
        {"name": g.stage, "model": str(folder.path / g.filename), "ctx": str(tmp / g.ctx_name)}
        for g in pair
    ]
    return {"graphs": graphs, "share": share, "options": options}


def _timeout(pair: tuple[Graph, Graph]) -> float:
    mib = max(g.data_bytes for g in pair) / (1 << 20)
    return len(pair) * (BASE_TIMEOUT_S + TIMEOUT_S_PER_MIB * mib)


def _run_worker(
    job: dict[str, Any], scratch: Path, soc: Soc, timeout: float, what: str
) -> dict[str, float]:
    """One worker process for ``job``; its stdout's JSON line, or a ConversionError."""
    log = scratch / f"{job['graphs'][0]['name']}.stderr"
    with open(log, "xb") as err:
        try:
            done = subprocess.run(
                [sys.executable, "-m", WORKER],
                input=json.dumps(job).encode(),
                stdout=subprocess.PIPE,
                stderr=err,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ConversionError(
                f"compiling {what} for {soc.name} took longer than {timeout:.0f} s and was stopped",
                hint=f"the QNN log ended: {_tail(log)}" if _tail(log) else "free the CPU and retry",
            ) from exc
    if done.returncode != 0:
        how = (
            f"was killed by signal {-done.returncode} (out of memory?)"
            if done.returncode < 0
            else f"failed (exit {done.returncode})"
        )
        raise ConversionError(
            f"compiling {what} to a QNN HTP context binary for {soc.name} {how}",
            hint=f"the compiler said: {_tail(log) or '(nothing)'}",
        )
    try:
        reply = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        return {str(k): float(v) for k, v in reply["seconds"].items()}
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ConversionError(
            f"the QNN compile of {what} gave no result", hint=f"its log: {_tail(log)}"
        ) from exc


def _tail(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * STDERR_TAIL))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # ORT colours its log lines
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "LIBNATIVE" not in ln]
    return " | ".join(lines)[-STDERR_TAIL:]


def _check_outputs(folder: QdqFolder, tmp: Path) -> dict[str, int]:
    """Every wrapper is EPContext nodes only (embed_mode 0) naming .bin files that the
    compile wrote beside it; returns the binaries and their sizes."""
    import onnx

    binaries: dict[str, int] = {}
    for graph in (g for pair in folder.parts for g in pair):
        path = tmp / graph.ctx_name
        if not path.is_file():
            raise ConversionError(f"the QNN compile wrote no {graph.ctx_name}", hint=HINT)
        model = onnx.load(str(path), load_external_data=False)
        nodes = list(model.graph.node)
        if not nodes or any(n.op_type != "EPContext" for n in nodes):
            raise ConversionError(
                f"{graph.ctx_name} is not EPContext nodes only: part of the graph is not "
                "on the HTP",
                hint="the QNN log says which node it refused",
            )
        for node in nodes:
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if attributes.get("embed_mode") != 0:
                raise ConversionError(f"{graph.ctx_name} embeds its context binary", hint=HINT)
            name = attributes.get("ep_cache_context", b"")
            name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            if not _plain(name) or not name.endswith(".bin") or not (tmp / name).is_file():
                raise ConversionError(f"{graph.ctx_name} names {name!r}, not a .bin beside it")
            binaries[name] = (tmp / name).stat().st_size
    return binaries


def _plain(name: str) -> bool:
    try:
        return len(split_relative(name)) == 1
    except UnsafePathError:
        return False


def _context_config(folder: QdqFolder, soc: Soc, share: bool) -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(folder.config)
    decoder = config["model"]["decoder"]
    # the shipped session options are only these: none of the input's is carried over
    decoder["session_options"] = {"log_id": "onnxruntime-genai", "provider_options": []}
    stages = decoder["pipeline"][0]
    for stage in stages.values():
        stage.pop("session_options", None)
    session: dict[str, Any] = {
        "log_id": "onnxruntime-genai",
        "session.disable_cpu_ep_fallback": "1",
        "provider_options": [{"qnn": compile_options(soc, folder.quant)}],
    }
    if share:  # the prompt and token sessions of a part use one QNN context
        session["ep.share_ep_contexts"] = "1"
    for pair in folder.parts:
        for graph in pair:
            stages[graph.stage]["filename"] = graph.ctx_name
            stages[graph.stage]["session_options"] = dict(session)
    return config


def _context_settings(
    folder: QdqFolder, soc: Soc, share: bool, binaries: dict[str, int], seconds: dict[str, float]
) -> dict[str, Any]:
    from importlib.metadata import version

    import onnxruntime_qnn

    info = getattr(onnxruntime_qnn, "build_and_package_info", None)
    settings: dict[str, Any] = copy.deepcopy(folder.settings)
    settings["htp"].update(
        stage="context",
        soc=soc.key,
        soc_model=soc.soc_model,
        htp_arch=soc.htp_arch,
        shared_context=share,
        binaries=binaries,
        compiled_with={
            "qnn_sdk": str(getattr(info, "qnn_version", "") or ""),
            "onnxruntime_qnn": version("onnxruntime-qnn"),
            "onnxruntime": version("onnxruntime"),
        },
        compile_seconds=seconds,
    )
    return settings
