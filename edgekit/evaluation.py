"""``eval`` for bundles: open the variant and the reference, compare, record the result."""

from __future__ import annotations

from pathlib import Path, PurePath

from edgekit.accuracy import EvalResult, Reference, TransformersReference, evaluate
from edgekit.bundle_open import open_bundle, update_variant
from edgekit.converters.planner import quality
from edgekit.errors import EvalError
from edgekit.progress import ProgressCallback, no_progress
from edgekit.runtime import load
from edgekit.safe_files import read_capped
from edgekit.targets.contract import Target
from edgekit.targets.registry import runnable_targets

DEFAULT_TEXT_NAME = "edgekit default text"


def open_reference(reference: str, bundle: Path | None = None) -> Reference:
    """A logit source for ``reference``: a variant of ``bundle``, a Hugging Face folder
    (transformers, float32), or a model file a target loads (a .gguf file: llama.cpp with
    an f32 KV cache). Close it when done.

    Raises:
        EvalError: nothing of that name.
    """
    if bundle is not None:
        names = [v.name for v in open_bundle(bundle).manifest.variants]
        if reference in names:
            return load(bundle, variant=reference, logits=True)
    path = Path(reference)
    if path.is_dir() and (path / "config.json").is_file():
        return TransformersReference(path)
    targets = _file_targets()
    if path.is_file() and path.suffix in targets:
        target = targets[path.suffix]
        # a reference keeps its KV cache in f32 where the target lets one choose
        settings = {"kv_cache": "f32"} if "kv_cache" in target.load_settings else {}
        return target.load(path, logits=True, **settings)
    raise EvalError(
        f"reference {reference!r} is neither a variant of the bundle, a Hugging Face folder, "
        f"nor a {' or '.join(targets) or 'model'} file",
        hint="pass the model the bundle was made from, or another variant's name",
    )


def _file_targets() -> dict[str, type[Target]]:
    """File suffix -> the runnable target that evaluates a single file of that kind (the
    format's entry file: model.gguf -> .gguf)."""
    found: dict[str, type[Target]] = {}
    for target in runnable_targets():
        suffix = PurePath(target.format.entry).suffix
        if suffix and target.evaluates:
            found.setdefault(suffix, target)
    return found


#: An evaluation text is a book at most (Pride and Prejudice is 0.7 MB): 64 MiB bounds it.
MAX_EVAL_TEXT = 64 * 2**20


def _read_eval_text(path: Path) -> str:
    """The evaluation text, read as untrusted: a regular file of bounded size.

    Raises:
        EvalError: missing, not a regular file, unreadable or too large.
    """
    hint = "pass a UTF-8 text file with --text, or leave it out for the shipped text"
    try:
        raw = read_capped(path, max_bytes=MAX_EVAL_TEXT, error=EvalError, hint=hint)
    except FileNotFoundError as exc:
        raise EvalError(f"{path}: no such text file", hint=hint) from exc
    except OSError as exc:  # a name too long, a loop of links...
        raise EvalError(f"{path}: cannot be opened ({exc.strerror})", hint=hint) from exc
    return raw.decode("utf-8", errors="replace")


def eval_bundle(
    bundle: str | Path,
    *,
    variant: str | None,
    reference: str,
    text_file: str | Path | None = None,
    ctx: int = 512,
    chunks: int | None = 8,
    record: bool = False,
    progress: ProgressCallback = no_progress,
) -> tuple[str, EvalResult]:
    """Evaluate one variant of ``bundle`` against ``reference``; with ``record``, store the
    result in the bundle's manifest and in the local quality table."""
    text = _read_eval_text(Path(text_file)) if text_file else None
    session = load(bundle, variant=variant, logits=True, context=max(ctx, 512))
    try:
        ref = open_reference(reference, Path(bundle))
        try:
            result = evaluate(session, ref, text=text, ctx=ctx, chunks=chunks, progress=progress)
        finally:
            ref.close()
    finally:
        session.close()
    chosen = session.variant
    if record:
        quality.record(chosen.target, chosen.quant, result.kl_mean)
        update_variant(
            bundle,
            chosen.name,
            quality=result.quality(
                reference=str(reference), text=str(text_file or DEFAULT_TEXT_NAME)
            ),
        )
    return chosen.name, result
