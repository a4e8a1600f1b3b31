"""pack's quality gate (``--max-quality-loss``): every variant is evaluated against the
source right after its conversion, and the pack fails if one measures worse than allowed.

The source is opened once as the reference for all variants; each measurement is also
recorded in the local quality table (``planner.quality.record``), so the planner's
expectations improve with every pack.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from edgekit.accuracy import Reference, evaluate
from edgekit.converters.planner import quality
from edgekit.errors import QualityError, TargetUnavailableError
from edgekit.evaluation import DEFAULT_TEXT_NAME, open_reference
from edgekit.manifest import Quality
from edgekit.progress import ProgressCallback
from edgekit.targets.availability import target_status
from edgekit.targets.contract import Target

GATE_CTX = 512
GATE_CHUNKS = 4


def check_evaluable(target: type[Target]) -> None:
    """``--max-quality-loss`` can evaluate ``target``'s variants here.

    Raises:
        TargetUnavailableError: the target cannot run here, or gives no logits.
    """
    hint = "install the target's extra, or pack without --max-quality-loss"
    if not (target.runs and target.evaluates):
        why = target.runtime_note or "it gives no per-position logits"
        raise TargetUnavailableError(
            f"--max-quality-loss evaluates each variant on its target, and edgekit cannot "
            f"evaluate {target.name} variants: {why}",
            hint="pack without --max-quality-loss",
        )
    status = target_status(target)
    if not status.usable:
        raise TargetUnavailableError(
            f"--max-quality-loss evaluates each variant on its target, and {target.name} "
            f"cannot run here: {status.detail}",
            hint=hint,
        )


class QualityGate:
    """Evaluates packed variants against ``source``, opened (once) on the first check."""

    def __init__(self, source: Path, max_kl: float, progress: ProgressCallback) -> None:
        self.source, self.max_kl, self.progress = source, max_kl, progress
        self._reference: Reference | None = None

    def __enter__(self) -> QualityGate:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._reference is not None:
            self._reference.close()
            self._reference = None

    def check(self, target: type[Target], quant: str, path: Path) -> Quality:
        """Evaluate the variant at ``path``; its Quality for the manifest.

        Raises:
            QualityError: it measured a larger mean KL than allowed (the hint names the
                next larger format expected to meet the budget).
        """
        if self._reference is None:
            self._reference = open_reference(str(self.source))
        with target.load(path, logits=True) as session:
            result = evaluate(
                session,
                self._reference,
                ctx=GATE_CTX,
                chunks=GATE_CHUNKS,
                progress=self.progress,
            )
        quality.record(target.name, quant, result.kl_mean)
        if result.kl_mean > self.max_kl:
            sizes = [(q.name, q.bits_per_weight) for q in target.format.quants.values()]
            better = quality.next_larger_meeting(target.name, sizes, quant, self.max_kl)
            raise QualityError(
                f"{target.name} {quant} measured a mean KL of {result.kl_mean:.4f} nats/token "
                f"against the source; --max-quality-loss allows {self.max_kl}",
                hint=f"{better} is expected to meet it"
                if better
                else "no known format of this target is expected to meet it: allow more loss",
            )
        return result.quality(reference=str(self.source), text=DEFAULT_TEXT_NAME)
