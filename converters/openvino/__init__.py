"""The OpenVINO format package: OpenVINO IR folders with NNCF-compressed weights.

``FORMAT`` describes it (quantizations, per-tensor layout, the export edge); ``export``
converts a Hugging Face folder through optimum-intel. Importing the package imports no
SDK: the export imports optimum-intel, openvino and nncf when it runs.
"""

from __future__ import annotations

from edgekit.converters.openvino.format import OpenVinoFormat

FORMAT = OpenVinoFormat()

__all__ = ["FORMAT", "OpenVinoFormat"]
