"""The MLX format package: the folders mlx-lm loads (Apple's MLX: safetensors with
group-wise affine-quantized weights, a float scale and bias per group).

``FORMAT`` describes it (quantizations, per-tensor layout, the conversion edge);
``export`` converts a Hugging Face folder through mlx-lm in-process. Importing the
package imports no SDK: the conversion imports mlx and mlx-lm when it runs.
"""

from __future__ import annotations

from edgekit.converters.mlx.format import MlxFormat

FORMAT = MlxFormat()

__all__ = ["FORMAT", "MlxFormat"]
