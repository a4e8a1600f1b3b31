"""``eval`` for bundles: open the variant and the reference, compare, record the result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.accuracy import EvalResult, LogitSource, TransformersReference, evaluate
from edgekit.errors import EvalError
from edgekit.manifest import Quality
from edgekit.progress import ProgressCallback, no_progress


def open_reference(reference: str, bundle: Path | None = None) -> tuple[LogitSource, Any]:
    """A logit source for ``reference``: a variant of ``bundle``, a Hugging Face folder
    (transformers, float32), or a GGUF file (llama.cpp, f32 KV cache). Returns the source and
    something to close.

    Raises:
        EvalError: nothing of that name.
    """
    import edgekit

    if bundle is not None:
        from edgekit.bundle import open_bundle

        names = [v.name for v in open_bundle(bundle).manifest.variants]
        if reference in names:
            session = edgekit.load(bundle, variant=reference, logits=True)
            return session, session
    path = Path(reference)
    if path.is_dir() and (path / "config.json").is_file():
        ref = TransformersReference(path)
        return ref, ref
    if path.is_file() and path.suffix == ".gguf":
        from edgekit.targets.llamacpp import LlamaCppTarget

        session = LlamaCppTarget.load(path, logits=True, kv_cache="f32")
        return session, session
    raise EvalError(
        f"reference {reference!r} is neither a variant of the bundle, a Hugging Face folder, "
        "nor a .gguf file",
        hint="pass the model the bundle was made from, or another variant's name",
    )


#: An evaluation text is a book at most (Pride and Prejudice is 0.7 MB): 64 MiB bounds it.
MAX_EVAL_TEXT = 64 * 2**20


def _read_eval_text(path: Path) -> str:
    """The evaluation text, read as untrusted: a regular file of bounded size.

    Raises:
        EvalError: missing, not a regular file, unreadable or too large.
    """
    from edgekit.safe_files import read_capped

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
    import edgekit
    from edgekit.converters import quality

    text = _read_eval_text(Path(text_file)) if text_file else None
    session = edgekit.load(bundle, variant=variant, logits=True, context=max(ctx, 512))
    ref, closer = open_reference(reference, Path(bundle))
    try:
        result = evaluate(session, ref, text=text, ctx=ctx, chunks=chunks, progress=progress)
    finally:
        session.close()
        closer.close()
    chosen = session.variant
    if record:
        quality.record(chosen.target, chosen.quant, result.kl_mean)
        from edgekit.bundle import update_variant

        update_variant(
            bundle,
            chosen.name,
            quality=Quality.of(
                result, reference=str(reference), text=str(text_file or "edgekit default text")
            ),
        )
    return chosen.name, result
