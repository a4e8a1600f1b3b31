"""QDQ quantization of the static decoder for the QNN HTP (the W8A16 quant), calibrated on
local text.

ONNX Runtime's QNN helpers (``onnxruntime.quantization.execution_providers.qnn``:
``get_qnn_qdq_config`` + ``quantize``) insert QuantizeLinear/DequantizeLinear pairs the QNN
EP folds into integer HTP ops. The graph is quantized ONCE, sequence-dynamic, and the prompt
and token graphs are cut from it afterwards, so both carry the same weights and scales.

Calibration walks the text as the pipeline runs it: ``prompt_windows`` consecutive windows
of the prompt width (the first on an empty cache), then ``token_steps`` single tokens, each
sample's KV cache computed by the FP32 graph itself from the samples before it (one sample
held at a time: a cache is ``context`` long in every layer).

Every setting is in ``HtpQuantConfig``: the defaults are what was measured (prototype,
/tmp/ek15/qnn: uint16 activations, uint8 per-tensor weights; QNN 2.7.0 rejects per-channel
weights on MatMul).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.converters.onnx.htp_graph import PAST_SEQ_LEN, TOTAL_SEQ_LEN

from edgekit.errors import ConversionError, UnsupportedConversionError

SHIPPED_TEXT = "pride-and-prejudice-opening.txt"  # in edgekit.data
TEXT_MAX_BYTES = 16 << 20
QUANT_TYPES = ("QUInt8", "QUInt16", "QInt8", "QInt16", "QUInt4", "QInt4")
METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")


@dataclass(frozen=True, kw_only=True)
class HtpQuantConfig:
    """How a QDQ variant (W8A16, W16A16) is quantized (one place to change the defaults)."""

    activation_type: str = "QUInt16"
    weight_type: str = "QUInt8"
    per_channel: bool = False  # QNN 2.7.0 rejects per-channel MatMul weights
    # lm_head's weights at another type (e.g. "QUInt16"); None: weight_type. Measured on
    # SmolLM2-135M: QUInt16 lifted top-1 agreement from 63% to 65% only (not the default)
    lm_head_weight_type: str | None = None
    calibration_method: str = "MinMax"
    prompt_windows: int = 4  # calibration samples of the prompt width
    token_steps: int = 16  # single-token samples after them

    def __post_init__(self) -> None:
        for value in (self.activation_type, self.weight_type, self.lm_head_weight_type):
            if value is not None and value not in QUANT_TYPES:
                raise UnsupportedConversionError(
                    f"quant type {value!r} is not one ONNX Runtime's quantizer has",
                    hint=f"use one of {', '.join(QUANT_TYPES)}",
                )
        if self.calibration_method not in METHODS:
            raise UnsupportedConversionError(
                f"calibration method {self.calibration_method!r} is not known",
                hint=f"use one of {', '.join(METHODS)}",
            )
        if min(self.prompt_windows, self.token_steps + 1) < 1:
            raise UnsupportedConversionError("calibration needs at least one prompt window")

    def tokens_needed(self, window: int) -> int:
        return self.prompt_windows * window + self.token_steps


DEFAULT_QUANT = HtpQuantConfig()
# The QDQ quants and how each is quantized. Measured on SmolLM2-135M (128 tokens, the QDQ
# graph on the CPU provider against the FP32 static graphs): uint8 per-tensor weights
# agree on 63% of next tokens (KL 0.45), however the activations are quantized: the loss
# is spread over every weight group; uint16 weights agree on 94% (KL 0.022) and compile
# for SM8750 with no CPU fallback; int4 weights 19%. What is left is the residual
# stream's outlier channel (about +-24,900 from layer 12) at uint16 activations.
QUANT_CONFIGS: dict[str, HtpQuantConfig] = {
    "W8A16": DEFAULT_QUANT,
    "W16A16": HtpQuantConfig(weight_type="QUInt16"),
}


def calibration_text(path: str | Path | None) -> tuple[str, str]:
    """The calibration text's file name and content: ``path`` (recipe.calibration) or the
    shipped Austen excerpt.

    Raises:
        UnsupportedConversionError: not a regular UTF-8 file of 1 byte to 16 MiB.
    """
    if path is None:
        from importlib import resources

        return SHIPPED_TEXT, resources.files("edgekit.data").joinpath(SHIPPED_TEXT).read_text(
            encoding="utf-8"
        )
    text = Path(path)
    try:
        if text.is_symlink() or not text.is_file():
            raise UnsupportedConversionError(
                f"calibration={text}: not a regular file",
                hint="give a local UTF-8 text file (or leave calibration unset)",
            )
        size = text.stat().st_size
        if not 0 < size <= TEXT_MAX_BYTES:
            raise UnsupportedConversionError(
                f"calibration={text}: {size} bytes", hint="give 1 byte to 16 MiB of UTF-8 text"
            )
        return text.name, text.read_bytes()[:TEXT_MAX_BYTES].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsupportedConversionError(f"calibration={text}: not UTF-8 text") from exc
    except OSError as exc:
        raise UnsupportedConversionError(f"calibration={text}: {exc.strerror}") from exc


def calibration_tokens(tokenizer_json: Path, text: str, limit: int) -> list[int]:
    """The first ``limit`` token ids of ``text`` with the model's tokenizer.

    Raises:
        UnsupportedConversionError: the text gives fewer than 2 tokens.
    """
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids
    if len(ids) < 2:
        raise UnsupportedConversionError(
            f"the calibration text gives {len(ids)} token(s)", hint="give a longer text"
        )
    return list(ids[:limit])


def cpu_session(path: Path) -> Any:
    """An ONNX Runtime CPU session with its warnings kept out of the terminal."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def walk_feeds(
    session: Any,
    ids: list[int],
    window: int,
    windows: int,
    ranges: dict[str, tuple[float, float]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Feeds of the sequence-dynamic static graph: ``windows`` prompt windows, then one
    token at a time; the KV cache after each comes from ``session`` (the FP32 graph).
    ``ranges`` collects each cache tensor's min and max over its written positions."""
    import numpy as np

    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    cache = {i.name: np.zeros(i.shape, np.float32) for i in past}
    names = [o.name for o in session.get_outputs()]
    pos = 0
    while pos < len(ids):
        step = min(window if pos < windows * window else 1, len(ids) - pos)
        feeds = {
            "input_ids": np.asarray([ids[pos : pos + step]], np.int64),
            PAST_SEQ_LEN: np.asarray([[pos + step - 1]], np.int32),
            TOTAL_SEQ_LEN: np.asarray(pos + step, np.int32),
            **cache,
        }
        yield feeds
        result = dict(zip(names, session.run(None, feeds), strict=True))
        pos += step
        cache = {p: result[p.replace("past_key_values", "present")] for p in cache}
        for name, value in cache.items():
            # past the written positions the buffer is not the model's: GQA's sliding-window
            # cache (Gemma 3) leaves uninitialized memory there
            value[:, :, pos:, :] = 0.0
            if ranges is not None:
                low, high = ranges.get(name, (0.0, 0.0))
                written = value[:, :, :pos, :]
                ranges[name] = (min(low, float(written.min())), max(high, float(written.max())))


class _Reader:
    """onnxruntime's CalibrationDataReader over ``walk_feeds`` (made lazily: one sample's
    cache in memory at a time)."""

    def __init__(self, fp32_static: Path, ids: list[int], window: int, windows: int) -> None:
        self._args = (fp32_static, ids, window, windows)
        self._feeds: Iterator[dict[str, Any]] | None = None
        self.count = 0

    def get_next(self) -> dict[str, Any] | None:
        if self._feeds is None:
            path, ids, window, windows = self._args
            self._feeds = walk_feeds(cpu_session(path), ids, window, windows)
        feeds = next(self._feeds, None)
        self.count += feeds is not None
        return feeds

    def rewind(self) -> None:
        self._feeds = None


def _qdq_config(
    fp32_static: Path,
    reader: Any,
    config: HtpQuantConfig,
    overrides: dict[str, Any] | None,
    ids: list[int],
    window: int,
) -> Any:
    """ONNX Runtime's QNN QDQ configuration for ``config``, with the KV cache's ranges
    taken from the written positions."""
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    qdq = get_qnn_qdq_config(
        str(fp32_static),
        reader,
        calibrate_method=getattr(CalibrationMethod, config.calibration_method),
        activation_type=getattr(QuantType, config.activation_type),
        weight_type=getattr(QuantType, config.weight_type),
        per_channel=config.per_channel,
        init_overrides=overrides,
    )
    qdq.use_external_data_format = True
    ranges = qdq.extra_options.setdefault("TensorQuantOverrides", {})
    for name, (low, high) in _cache_ranges(fp32_static, ids, window, config).items():
        # the calibrator's own min/max of GQA's present outputs would include the
        # unwritten tail of the static buffer (measured: Gemma 3 scales of 1e33 in one
        # build of two): the written positions' range, for past and present alike
        for tensor in (name, name.replace("past_key_values", "present")):
            ranges[tensor] = [{"rmin": np.float32(low), "rmax": np.float32(high)}]
    # no CalibMaxIntermediateOutputs: onnxruntime 1.32's MinMax calibrator drops the
    # samples it clears without reducing them ("No data is collected"); MinMax keeps
    # only each tensor's min and max per sample anyway
    return qdq


def quantize_static(
    fp32_static: Path, out: Path, ids: list[int], window: int, config: HtpQuantConfig
) -> int:
    """QDQ ``fp32_static`` (the sequence-dynamic static graph) into ``out`` (+ ``out``.data)
    calibrated on ``ids``; returns the number of calibration samples.

    Raises:
        ConversionError: the quantizer failed.
    """
    from onnxruntime.quantization import QuantType, quantize

    reader = _Reader(fp32_static, ids, window, config.prompt_windows)
    overrides = None
    if config.lm_head_weight_type is not None:
        kind = getattr(QuantType, config.lm_head_weight_type)
        overrides = {name: [{"quant_type": kind}] for name in _lm_head_weights(fp32_static)}
    import onnxruntime as ort
    from edgekit.converters.quiet import quiet_builder

    try:
        # the quantizer warns on the root logger, and its calibration sessions through
        # ONNX Runtime's default logger (unused initializers of every graph it opens)
        ort.set_default_logger_severity(3)
        with quiet_builder():
            qdq = _qdq_config(fp32_static, reader, config, overrides, ids, window)
            quantize(str(fp32_static), str(out), qdq)
    except MemoryError as exc:
        raise ConversionError(
            "QDQ calibration ran out of memory",
            hint="calibration runs the FP32 graph: free memory or lower prompt_windows",
        ) from exc
    except Exception as exc:  # the quantizer raises bare ValueError/RuntimeError
        raise ConversionError(
            f"QDQ quantization failed: {type(exc).__name__}: {exc}",
            hint="edgekit -vv convert ... shows ONNX Runtime's quantizer log",
        ) from exc
    finally:
        ort.set_default_logger_severity(2)  # ONNX Runtime's default: warnings
    return reader.count


def _cache_ranges(
    fp32_static: Path, ids: list[int], window: int, config: HtpQuantConfig
) -> dict[str, tuple[float, float]]:
    ranges: dict[str, tuple[float, float]] = {}
    for _ in walk_feeds(cpu_session(fp32_static), ids, window, config.prompt_windows, ranges):
        pass
    return ranges


def _lm_head_weights(path: Path) -> list[str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    return [i for n in model.graph.node if "lm_head" in n.name for i in n.input if i in inits]
