"""Hugging Face folder -> MLX variant, through mlx-lm in-process.

The source is loaded lazily (``mlx_lm.utils.load_model``: tensors are read when cast or
quantized), cast to the build's float type, quantized with ONE predicate built from the
recipe (``layout.module_bits``: the bits the layout plans are the bits written), or
AWQ-quantized on local text (``awq``), and saved with mlx-lm's own writers
(``save_model``, ``save_config``): the folder loads in mlx-lm unchanged. The source's
tokenizer files are copied byte for byte (a tool's re-save changed SmolLM2's
pre-tokenizer once: issue 15), and ``edgekit.json`` records what was built. mlx-lm's
prints and progress bars go to edgekit's debug log.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.edge_checks import hf_side_files
from edgekit.converters.mlx.awq import quantizable_module
from edgekit.converters.mlx.config import mlx_config_changes
from edgekit.converters.mlx.layout import module_bits
from edgekit.converters.mlx.plan import KV_GROUP, MlxBuild
from edgekit.converters.quiet import quiet_tools

from edgekit.atomic import atomic_path, check_destination
from edgekit.errors import ConversionError, EdgekitError, UnsupportedConversionError
from edgekit.inspection import read_config
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress
from edgekit.safetensors_header import safetensors_files

log = logging.getLogger(__name__)

SETTINGS_FILE = "edgekit.json"
_FLOAT_LABELS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_NOISY = ("mlx", "mlx_lm", "transformers", "tokenizers")
_STEPS = 4


@dataclass(frozen=True, kw_only=True)
class MlxResult:
    path: Path
    quant: str
    warnings: tuple[str, ...]


def hf_to_mlx(
    src: Path,
    out: Path,
    build: MlxBuild,
    *,
    force: bool = False,
    progress: ProgressCallback = no_progress,
) -> MlxResult:
    """Build ``build`` (checked by ``plan.mlx_build``) from the Hugging Face folder ``src``
    into the folder ``out``, atomically.

    Raises:
        OutputExistsError: ``out`` exists and ``force`` is not set.
        ConversionError: mlx-lm failed; nothing is left at ``out``.
    """
    check_destination(out, force=force)
    changes = mlx_config_changes(read_config(src))
    check_source(src)
    with atomic_path(out, force=force) as tmp:
        tmp.mkdir()
        with quiet_tools(_NOISY, log) as chatter:
            try:
                bits = _convert(src, tmp, build, changes, progress)
            except EdgekitError:
                raise
            except (RuntimeError, ValueError, OSError, KeyError, TypeError) as exc:
                tail = "; ".join(chatter.tail)
                raise ConversionError(
                    f"mlx-lm could not convert {src}: {exc}",
                    hint=f"mlx-lm said: {tail}" if tail else "",
                ) from exc
        _copy_source_files(src, tmp)
        settings = _settings(build, bits, src)
        (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=2), encoding="utf-8")
        progress(ProgressEvent(stage="convert", done=_STEPS, total=_STEPS, detail="written"))
    for w in build.warnings:
        log.info("%s", w)
    return MlxResult(path=out, quant=build.plan.quant, warnings=build.warnings)


def _convert(
    src: Path, tmp: Path, build: MlxBuild, changes: dict[str, Any], progress: ProgressCallback
) -> dict[str, int]:
    """Load, cast, quantize, save; returns how many modules got each storage."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    progress(ProgressEvent(stage="convert", done=0, total=_STEPS, detail="loading the source"))
    model, config = load_model(src, lazy=True, model_config=changes)
    dtype = getattr(mx, build.dtype)
    cast_predicate = getattr(model, "cast_predicate", lambda _: True)

    def cast(path: str, value: Any) -> Any:
        if cast_predicate(path) and mx.issubdtype(value.dtype, mx.floating):
            return value.astype(dtype)
        return value

    model.update(tree_map_with_path(cast, model.parameters()))
    progress(ProgressEvent(stage="convert", done=1, total=_STEPS, detail=build.plan.quant))
    plan = build.plan
    if build.calibration:
        from edgekit.converters.mlx.awq import awq_quantize

        config = awq_quantize(model, config, src, build)
    elif plan.bits:

        def predicate(path: str, module: Any) -> bool | dict[str, Any]:
            bits = module_bits(path, plan)
            if bits == 0:
                return False
            if bits == plan.bits:
                return True
            return {"group_size": plan.group_size, "bits": bits, "mode": "affine"}

        model, config = quantize_model(
            model, config, plan.group_size, plan.bits, mode="affine", quant_predicate=predicate
        )
    progress(ProgressEvent(stage="convert", done=2, total=_STEPS, detail="saving"))
    counts = storage_counts(model)
    save_model(tmp, model, donate_model=True)
    save_config(dict(config), tmp / "config.json")
    mx.clear_cache()
    progress(ProgressEvent(stage="convert", done=3, total=_STEPS, detail="tokenizer"))
    return counts


def storage_counts(model: Any) -> dict[str, int]:
    """Modules per storage ("4BIT/g64", "F32"...) among the quantizable ones."""
    counts: dict[str, int] = {}
    for _, module in model.named_modules():
        bits = getattr(module, "bits", None)
        if bits is not None:
            key = f"{bits}BIT/g{module.group_size}"
        elif quantizable_module(module):
            key = _FLOAT_LABELS.get(str(module.weight.dtype).rpartition(".")[2], "float")
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def check_source(src: Path) -> None:
    """Every file mlx-lm or the copy opens from ``src`` is a regular file inside it (a
    link to one, as in a Hugging Face cache snapshot, is followed) of a bounded size, and
    the weights mlx-lm loads are exactly those inspection read: ``load_model`` globs
    ``model*.safetensors`` whatever the index says (config.json is read_config's).

    Raises:
        ModelFormatError: a file is a FIFO, a device, a link out of the folder...
        UnsupportedConversionError: an oversized file, a stray shard, or shards mlx-lm
            would not find.
    """
    hf_side_files(src)
    named = {str(src / p.name) for p in safetensors_files(src)}
    # the very pattern mlx-lm globs (so a folder name holding glob characters counts too)
    globbed = set(glob.glob(str(src / "model*.safetensors")))
    if globbed - named:
        extra = sorted(Path(p).name for p in globbed - named)
        raise UnsupportedConversionError(
            f"{src}: {', '.join(extra[:5])} is not a shard the index names, but mlx-lm "
            "loads every model*.safetensors in the folder",
            hint="remove the stray file, or convert a folder holding only the model's shards",
        )
    if named - globbed:
        unseen = sorted(Path(p).name for p in named - globbed)
        raise UnsupportedConversionError(
            f"{src}: mlx-lm loads only model*.safetensors, and {', '.join(unseen[:5])} "
            "is not named so",
            hint="rename the shards model-00001-of-0000N.safetensors (and the index's "
            "weight_map with them), or model.safetensors for one file",
        )


def _copy_source_files(src: Path, out: Path) -> None:
    for checked in hf_side_files(src):
        shutil.copyfile(checked, out / checked.name)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _settings(build: MlxBuild, counts: dict[str, int], src: Path) -> dict[str, Any]:
    plan = build.plan
    return {
        "quant": plan.quant,
        "group_size": plan.group_size if plan.bits else None,
        "dtype": build.dtype,
        "modules": counts,
        "kv_cache": build.kv_cache,
        "kv_bits": build.kv_bits,
        "kv_group_size": KV_GROUP if build.kv_bits else None,
        "calibration": Path(build.calibration).name if build.calibration else None,
        "method": "awq" if build.calibration else ("affine" if plan.bits else "float"),
        "tools": {"mlx": _version("mlx"), "mlx-lm": _version("mlx-lm")},
        "source": src.name,
        "warnings": list(build.warnings),
    }
