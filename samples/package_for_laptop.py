"""Package a model for this laptop, then run it.

    python samples/package_for_laptop.py [MODEL] [OUT]

MODEL is a Hugging Face folder or a GGUF file (default: the embedded SmolLM2-135M);
OUT is the bundle folder to write (default: ./laptop.bundle). edgekit's planner picks the
target and format: the best quality that fits this machine's memory, predicted by the
same model `edgekit plan`, `edgekit pack` and `edgekit.load` use, so the bundle it packs
is one `edgekit.load` admits here.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edgekit.converters.planner import Budgets, plan, with_budget_defaults

import edgekit

GIB = 1 << 30


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else edgekit.default_model_path()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("laptop.bundle")

    host = edgekit.probe_host()  # its profile lists the targets usable here
    spec = edgekit.inspect_model(model)
    result = plan(spec, host.profile, with_budget_defaults(spec, Budgets()))
    pick = result.choice
    if pick is None:
        sys.exit(f"{host.profile.display_name}: {result.summary}")
    need, limit = pick.prediction.memory_bytes / GIB, pick.memory_limit_bytes / GIB
    print(f"{host.profile.display_name}: {pick.label}, {need:.2f} of {limit:.1f} GiB (predicted)")

    request = edgekit.VariantRequest.from_plan(result)  # carries the predictions along
    packed = edgekit.pack(model, out, [request], force=True)
    for warning in packed.warnings:
        print("warning:", warning)
    print(f"bundle: {packed.path} ({', '.join(v.name for v in packed.manifest.variants)})")

    with edgekit.load(packed.path) as session:
        reply = session.generate("The capital of France is", max_tokens=24, temperature=0)
        print(f"{session.variant.name}: {reply.text.strip()!r}")


if __name__ == "__main__":
    main()
