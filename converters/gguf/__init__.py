"""The GGUF format package: llama.cpp's single-file format.

``FORMAT`` describes it (quantizations, per-tensor layout, conversion edges); the
modules beside it convert to and from it (``from_hf``, ``to_hf``, ``quantize``), describe
each family's GGUF layout (``arch``) and carry tokenizers across (``tokenizer``).
Importing the package imports no SDK: the converters import numpy, gguf and llama_cpp
when they run.
"""

from __future__ import annotations

from edgekit.converters.gguf.format import GgufFormat

FORMAT = GgufFormat()

__all__ = ["FORMAT", "GgufFormat"]
