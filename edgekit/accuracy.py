"""Accuracy after quantization: perplexity, KL divergence and top-1 agreement against a
reference, on the same tokens, chunk by chunk.

Method (the same for every runtime):

1. The text is tokenized once by the evaluated model; the reference must produce the same
   token ids for it (checked), so both score identical positions.
2. The tokens are cut into consecutive, non-overlapping windows of ``ctx`` tokens; each
   window is evaluated from an empty cache, and only its second half is scored, so every
   scored token has at least ctx/2 tokens of context (llama.cpp's perplexity tool scores
   the second half of each chunk in the same way).
3. Per scored position: the negative log-likelihood of the actual next token (perplexity
   = exp of their mean), KL(reference || evaluated) of the next-token distributions, and
   whether the two argmaxes agree.
4. Only one window's logits are held at a time: memory is ctx x vocabulary x 2 floats.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from edgekit.errors import EvalError
from edgekit.manifest import Quality
from edgekit.progress import ProgressCallback, ProgressEvent, no_progress

if TYPE_CHECKING:
    import numpy as np

DEFAULT_CTX = 512
DEFAULT_CHUNKS = 8


class LogitSource(Protocol):
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    def logits(self, tokens: list[int]) -> np.ndarray: ...


class Reference(LogitSource, Protocol):
    """A logit source that holds a model until closed (a Session, TransformersReference)."""

    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class EvalResult:
    perplexity: float
    reference_perplexity: float
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    tokens_scored: int
    ctx: int
    chunks: int

    def quality(self, *, reference: str, text: str) -> Quality:
        """The manifest's record of this result (``Variant.quality``)."""
        return Quality(
            reference=reference,
            text=text,
            perplexity=self.perplexity,
            reference_perplexity=self.reference_perplexity,
            kl_mean=self.kl_mean,
            kl_p99=self.kl_p99,
            top1_agreement=self.top1_agreement,
            tokens_scored=self.tokens_scored,
            ctx=self.ctx,
        )


def default_text() -> str:
    """The evaluation text shipped with edgekit (the opening of Pride and Prejudice)."""
    return resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt").read_text()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    import numpy as np

    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    out: np.ndarray = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return out


def evaluate(
    model: LogitSource,
    reference: LogitSource,
    *,
    text: str | None = None,
    ctx: int = DEFAULT_CTX,
    chunks: int | None = DEFAULT_CHUNKS,
    progress: ProgressCallback = no_progress,
) -> EvalResult:
    """Compare ``model`` with ``reference`` on ``text`` (default: the shipped text).

    Raises:
        EvalError: the two tokenize the text differently, or it is shorter than one window.
    """
    import numpy as np

    text = text if text is not None else default_text()
    ids = model.tokenize(text)
    reference_ids = reference.tokenize(text)
    if reference_ids != ids:
        raise _tokenization_differs(ids, reference_ids)
    n_windows = len(ids) // ctx
    if chunks is not None:
        n_windows = min(n_windows, chunks)
    if n_windows == 0:
        raise EvalError(
            f"the text has {len(ids)} tokens; one window needs {ctx}",
            hint="use a longer text or a smaller --ctx",
        )
    nll, ref_nll, kls, agree = [], [], [], []
    half = ctx // 2
    for w in range(n_windows):
        window = ids[w * ctx : (w + 1) * ctx]
        targets = np.asarray(window[half:], dtype=np.int64)
        lq = _log_softmax(model.logits(window)[half - 1 : ctx - 1])
        lp = _log_softmax(reference.logits(window)[half - 1 : ctx - 1])
        rows = np.arange(len(targets))
        nll.append(-lq[rows, targets])
        ref_nll.append(-lp[rows, targets])
        kls.append((np.exp(lp) * (lp - lq)).sum(-1))
        agree.append(lq.argmax(-1) == lp.argmax(-1))
        progress(ProgressEvent(stage="eval", done=w + 1, total=n_windows, detail=f"window {w + 1}"))
    kl = np.concatenate(kls).clip(min=0.0)  # rounding can make a zero KL slightly negative
    return EvalResult(
        perplexity=float(np.exp(np.concatenate(nll).mean())),
        reference_perplexity=float(np.exp(np.concatenate(ref_nll).mean())),
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        top1_agreement=float(np.concatenate(agree).mean()),
        tokens_scored=int(kl.size),
        ctx=ctx,
        chunks=n_windows,
    )


def _tokenization_differs(ids: list[int], reference_ids: list[int]) -> EvalError:
    first = next(
        (i for i, (a, b) in enumerate(zip(ids, reference_ids, strict=False)) if a != b),
        min(len(ids), len(reference_ids)),
    )
    return EvalError(
        "the model and the reference tokenize the text differently, so their token "
        f"distributions cannot be compared position by position: they first differ at "
        f"token {first} (model {ids[first : first + 3]}, reference "
        f"{reference_ids[first : first + 3]}; {len(ids)} vs {len(reference_ids)} tokens)",
        hint="if the model was converted from this reference by another tool or an older "
        "edgekit, convert it again with `edgekit convert REFERENCE --to gguf` (edgekit "
        "writes the GGUF tokenizer to match its source token for token) and read the "
        "conversion's warnings; otherwise the reference is another model: pass the folder "
        "or variant this one was made from",
    )


class TransformersReference:
    """A Hugging Face folder run by transformers on the CPU in float32: the reference."""

    def __init__(self, folder: str | Path) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise EvalError(
                "a Hugging Face reference needs torch and transformers",
                hint="pip install 'edgekit[reference]'",
            ) from exc
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        # The whole text is tokenized once and then windowed: the model never sees more than
        # one window, so the tokenizer's length warning does not apply.
        self.tokenizer.model_max_length = 1 << 40
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model.eval()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special)["input_ids"])

    def logits(self, tokens: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            out: np.ndarray = self.model(self._torch.tensor([tokens])).logits[0].numpy()
        return out

    def close(self) -> None:
        del self.model
