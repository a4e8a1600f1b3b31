"""Package a model for this laptop, then run it.

    python samples/package_for_laptop.py [MODEL] [OUT]

MODEL is a Hugging Face folder or a GGUF file (default: the embedded SmolLM2-135M);
OUT is the bundle folder to write (default: ./laptop.bundle). The quantization follows
the memory this machine has: Q8_0 when the model fits twice over, Q4_K_M otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import edgekit


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else edgekit.default_model_path()
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("laptop.bundle")

    host = edgekit.probe_host()
    spec = edgekit.inspect_model(model)
    usable = host.profile.memory.usable_gib * (1 << 30)
    q8_bytes = spec.parameters * 8.5 / 8  # Q8_0 stores 8.5 bits per weight
    quant = "Q8_0" if 2 * q8_bytes < usable else "Q4_K_M"
    print(
        f"{host.profile.display_name}: {host.profile.memory.usable_gib:.1f} GiB usable -> {quant}"
    )

    result = edgekit.pack(model, out, [edgekit.VariantRequest(quant=quant)], force=True)
    for warning in result.warnings:
        print("warning:", warning)
    print(f"bundle: {result.path} ({', '.join(v.name for v in result.manifest.variants)})")

    with edgekit.load(result.path) as session:
        reply = session.generate("The capital of France is", max_tokens=24, temperature=0)
        print(f"{session.variant.name}: {reply.text.strip()!r}")


if __name__ == "__main__":
    main()
