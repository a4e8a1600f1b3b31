"""The Intel target: OpenVINO IR through openvino-genai's LLMPipeline (no torch at run time).

Device: NPU > GPU > CPU among the devices OpenVINO lists, unless one is asked for; an
absent device is refused, naming those present. NPU settings (a static prompt length and
a minimum response length) are passed to the pipeline, and a prompt longer than the
NPU's maximum is refused with an error instead of being run.

Precision: ``inference_precision`` (f32, bf16, f16) and ``kv_cache`` (f16, u8, ...) are
OpenVINO's INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION. The default inference
precision on CPU is f32: it is the one that passes the greedy parity test against
transformers (bf16, the CPU plugin's own default on bf16-capable CPUs, moves logits by
about 1e-2 and flips greedy choices on small models).

Every setting is checked before OpenVINO sees it (targets/checks.py): OpenVINO accepts a
thread count of 100000 and runs a token id past its vocabulary without a word.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.openvino import FORMAT
from edgekit.targets import checks
from edgekit.targets.contract import Coefficients, HostDevice, Target, UnitKind, UnitSupport
from edgekit.targets.openvino_runtime import (
    PipelineRun,
    configure,
    logits_feed,
    read_json,
    read_settings,
    special_token_texts,
    token_text,
    tokenized_inputs,
    vocab_size,
)
from edgekit.targets.runtime_calls import backend_errors
from edgekit.targets.session import Session
from edgekit.targets.templates import NO_TEMPLATE_HINT, render_chat_template
from edgekit.targets.values import Sampling, SessionInfo, StreamChunk

from edgekit.errors import GenerationError, ModelFormatError, SettingError, TargetUnavailableError

if TYPE_CHECKING:
    import numpy as np
    from edgekit.targets.openvino_batch import OpenVinoBatch
    from edgekit.targets.openvino_runtime import Settings

    from edgekit.devices import Accelerator, DeviceProfile

DEVICE_ORDER = ("NPU", "GPU", "CPU")
SETTINGS = (
    "device",
    "inference_precision",
    "kv_cache",
    "threads",
    "context",
    "max_prompt_len",
    "min_response_len",
    "logits",
    "parallel",
)


MB = 1 << 20
# Instruction sets on which the CPU plugin infers in bf16 (at twice the fp32 rate)
_BF16_ISA = frozenset({"avx512_bf16", "amx_bf16"})


class OpenVinoTarget(Target):
    """OpenVINO IR folders on Intel CPUs, GPUs and NPUs (openvino-genai's LLMPipeline)."""

    name: ClassVar[str] = "openvino"
    display_name: ClassVar[str] = "Intel OpenVINO"
    devices: ClassVar[str] = "Intel CPUs, integrated and Arc GPUs, Core Ultra NPUs"
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = "pip install 'edgekit[openvino]'"
    sdk_modules: ClassVar[tuple[str, ...]] = ("openvino", "openvino_genai")
    distribution: ClassVar[str] = "openvino"
    priority: ClassVar[int] = 10
    load_settings: ClassVar[tuple[str, ...]] = SETTINGS
    devices_accepted: ClassVar[tuple[str, ...]] = ("auto", *DEVICE_ORDER)
    # First estimates; reasoning, in order of the fields:
    #  CPU: measured on this project's machine (SmolLM2 INT4/INT8): decode like llama.cpp;
    #    resident memory grows ~1.8 bytes per weight byte (the CPU plugin keeps its own
    #    copy of most weights beside the mapped file), ~180 MB of plugin and compiled-model
    #    buffers; the KV cache grows with the tokens used.
    #  GPU, NPU: no measurement here; bandwidth efficiencies from public token-generation
    #    figures, lower for NPUs whose LLM pipelines are younger; round runtime buffers.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="cpu",
            formats=("F16", "INT8", "INT4"),
            priors=Coefficients(
                bandwidth_efficiency=0.55,
                token_overhead_s=0.0005,
                compute_efficiency=0.5,
                runtime_bytes=180 * MB,
                weight_residency=1.8,
                kv_preallocated=False,
                # measured here: peak RSS grows 71 KB per context token for SmolLM2 INT4
                # (prompts of 128-1024 tokens) where its f16 KV cache is 23 KB per token
                kv_scale=3.0,
            ),
        ),
        UnitSupport(
            kind="gpu",
            formats=("F16", "INT8", "INT4"),
            priors=Coefficients(
                bandwidth_efficiency=0.5,
                token_overhead_s=0.002,
                compute_efficiency=0.3,
                runtime_bytes=400 * MB,
                weight_residency=1.0,
                kv_preallocated=False,
            ),
        ),
        UnitSupport(
            kind="npu",
            # NPUs run symmetric channel-wise INT4 (openvino-genai NPU guide)
            formats=("F16", "INT8", "INT4_SYM"),
            priors=Coefficients(
                bandwidth_efficiency=0.4,
                token_overhead_s=0.003,
                compute_efficiency=0.2,
                runtime_bytes=300 * MB,
                weight_residency=1.0,
                kv_preallocated=True,  # static shapes: the KV cache is sized at compile time
            ),
        ),
    )

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """Each of the device's units OpenVINO names CPU, GPU or NPU."""
        return [a for a in profile.accelerators if a.runtime_device in DEVICE_ORDER]

    @classmethod
    def compute_precision(
        cls, profile: DeviceProfile, accelerator: Accelerator, fp32_tflops: float | None
    ) -> tuple[str, float | None] | None:
        """bf16 at twice the fp32 rate on CPUs with AVX512_BF16 or AMX: the CPU plugin
        infers in bf16 there."""
        if accelerator.kind == "cpu" and fp32_tflops and _BF16_ISA & set(profile.cpu.isa):
            return "bf16", fp32_tflops * 2
        return None

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """The devices OpenVINO lists here (usable when it lists one)."""
        devices = available_devices()
        return bool(devices), f"devices: {', '.join(devices)}" if devices else "no OpenVINO device"

    @classmethod
    def host_devices(cls) -> tuple[HostDevice, ...]:
        """The GPUs and NPUs OpenVINO lists here, with their full names."""
        import openvino as ov

        core = ov.Core()
        found = []
        for device in core.available_devices:
            kind = device.split(".")[0]
            if kind in ("GPU", "NPU"):
                name = str(core.get_property(device, "FULL_DEVICE_NAME"))
                unit: UnitKind = "npu" if kind == "NPU" else "gpu"
                found.append(HostDevice(kind=unit, device=device, name=name))
        return tuple(found)

    @classmethod
    def load_unit(cls, device: str) -> str:
        """On ``auto`` the session takes the best device present (NPU > GPU > CPU), so
        load admits by that unit's figures; a named device (GPU.1) by its kind."""
        kind = _device_name(device).split(".")[0]
        if kind == "AUTO":
            kind = pick_device("auto", available_devices()).split(".")[0]
        return super().load_unit(kind.lower())

    @classmethod
    def device_settings(cls, device: str) -> dict[str, Any]:
        """The device goes to the session as it is: it accepts auto, CPU, GPU, NPU in any
        case and one of several (GPU.1), and refuses any other with a SettingError."""
        return {"device": device}

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> OpenVinoSession:
        """Load an OpenVINO IR folder (openvino_model.xml + tokenizer IRs).

        Settings: ``device`` (auto, CPU, GPU, NPU), ``inference_precision``, ``kv_cache``,
        ``threads``, ``context``, ``max_prompt_len`` / ``min_response_len`` (NPU),
        ``parallel`` (N > 1: N generations decoded together by openvino-genai's
        ContinuousBatchingPipeline, each with ``context`` tokens of KV cache, prefix caching
        on; CPU and GPU: targets/openvino_batch.py).

        Raises:
            TargetUnavailableError: openvino-genai missing, or the device is not present.
            ModelFormatError: the folder is not an OpenVINO export with tokenizers.
            SettingError: an unknown setting, or one of the wrong type or out of range.
            GenerationError: OpenVINO refused the model.
        """
        checks.known_settings(settings, SETTINGS, what="OpenVINO setting")
        given = {k: v for k, v in settings.items() if v is not None}  # None: the default
        return OpenVinoSession(Path(model), **given)


def available_devices() -> list[str]:
    import openvino as ov

    return list(ov.Core().available_devices)


def pick_device(requested: str, present: Sequence[str]) -> str:
    """The device to run on: the one asked for, or the best present (NPU > GPU > CPU).

    Raises:
        SettingError: ``requested`` is not a device name OpenVINO has.
        TargetUnavailableError: the requested device is not present.
    """
    wanted = _device_name(requested)
    if wanted in ("AUTO", ""):
        for kind in DEVICE_ORDER:
            for device in present:
                if device.split(".")[0] == kind:
                    return device
        raise TargetUnavailableError("OpenVINO lists no device here")
    if wanted in present or any(d.split(".")[0] == wanted for d in present):
        return wanted
    raise TargetUnavailableError(
        f"device {requested!r} is not present; OpenVINO sees: {', '.join(present) or 'none'}",
        hint="use device='auto' to take the best one present",
    )


def _device_name(requested: object) -> str:
    """``requested`` as OpenVINO spells devices: AUTO, CPU, GPU, NPU, or GPU.1 and such."""
    valid = "auto, CPU, GPU, NPU (or one of several, as in GPU.1)"
    if not isinstance(requested, str):
        raise SettingError(
            f"device must be a string: one of {valid}, not {type(requested).__name__}",
            hint=f"use one of {valid}",
        )
    wanted = requested.upper()
    kind, _, index = wanted.partition(".")
    if wanted in ("AUTO", "") or (kind in DEVICE_ORDER and (not index or index.isdigit())):
        return wanted
    raise SettingError(f"device {requested!r} is not one of {valid}", hint=f"use one of {valid}")


class OpenVinoSession(Session):
    def __init__(
        self,
        folder: Path,
        *,
        device: str = "auto",
        inference_precision: str | None = None,
        kv_cache: str | None = None,
        threads: int | None = None,
        context: int | None = None,
        max_prompt_len: int | None = None,  # default: NPU_MAX_PROMPT, up to the context
        min_response_len: int | None = None,  # default: NPU_MIN_RESPONSE, up to the context
        logits: bool = False,  # accepted for the shared API: logits() always works here
        parallel: int = 1,
    ) -> None:
        super().__init__()
        try:
            import openvino_genai
        except ImportError as exc:
            raise TargetUnavailableError(
                "openvino-genai is not installed", hint="pip install 'edgekit[openvino]'"
            ) from exc
        for needed in ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml"):
            if not (folder / needed).is_file():
                raise ModelFormatError(
                    f"{folder}: no {needed}, so this is not an OpenVINO export edgekit can run",
                    hint="export it with: edgekit convert MODEL --to openvino -o DIR",
                )
        settings = read_settings(
            pick_device(device, available_devices()),
            folder,
            inference_precision=inference_precision,
            kv_cache=kv_cache,
            threads=threads,
            context=context,
            max_prompt_len=max_prompt_len,
            min_response_len=min_response_len,
        )
        checks.flag("logits", logits)
        parallel = checks.integer("parallel", parallel, low=1, high=64, note="streams")
        self._device = settings.device
        self._max_prompt = settings.max_prompt_len if settings.kind == "NPU" else None
        batch = self._open_pipeline(openvino_genai, folder, settings, parallel)
        try:
            self._finish_init(openvino_genai, folder, settings, parallel)
        except BaseException:
            if batch is not None:  # the batch's pipeline is freed now, not by the GC
                batch.close()
            raise
        if batch is not None:  # last: nothing above can fail with its loop running
            self._use_batching(batch)

    def _finish_init(
        self, openvino_genai: Any, folder: Path, settings: Settings, parallel: int
    ) -> None:
        self._genai = openvino_genai
        self._folder = folder
        self._read_tokenizer_files(folder)
        self._context = settings.context
        self._compiled: Any = None
        self._worker: threading.Thread | None = None  # the last generation's pipeline thread
        self._closed = False
        self.info = SessionInfo(
            target=OpenVinoTarget.name,
            model_path=str(folder),
            context_length=settings.context,
            threads=int(settings.properties().get("INFERENCE_NUM_THREADS", 0)),
            kv_cache=settings.kv_cache,
            settings={
                "device": self._device,
                "inference_precision": settings.precision,
                **({"parallel": parallel} if parallel > 1 else {}),
                **(
                    {
                        "max_prompt_len": settings.max_prompt_len,
                        "min_response_len": settings.min_response_len,
                    }
                    if settings.kind == "NPU"
                    else {}
                ),
            },
            vocab_size=vocab_size(read_json(folder / "config.json"), self._tokenizer),
            unit=settings.kind.lower(),
        )

    def _open_pipeline(
        self, genai: Any, folder: Path, settings: Settings, parallel: int
    ) -> OpenVinoBatch | None:
        """The LLMPipeline, or with ``parallel`` > 1 the batch's pipeline instead (the
        weights held once); sets ``_pipe`` (None when batched) and ``_tokenizer``."""
        self._pipe: Any = None
        if parallel > 1:
            from edgekit.targets.openvino_batch import open_batch

            batch = open_batch(folder, settings, slots=parallel)
            self._tokenizer = batch.tokenizer()
            return batch
        with backend_errors("OpenVINO", f"loading {folder} on {self._device}"):
            self._pipe = genai.LLMPipeline(str(folder), self._device, **settings.properties())
        self._tokenizer = self._pipe.get_tokenizer()
        return None

    def _read_tokenizer_files(self, folder: Path) -> None:
        """The chat template and BOS/EOS texts of the Hugging Face tokenizer files."""
        tok_config = read_json(folder / "tokenizer_config.json")
        template_file = folder / "chat_template.jinja"
        self._template = (
            template_file.read_text(encoding="utf-8")
            if template_file.is_file()
            else tok_config.get("chat_template")
        )
        self._bos = token_text(tok_config.get("bos_token"))
        self._eos = token_text(tok_config.get("eos_token"))
        self._tok_config = tok_config
        self._controls: tuple[str, ...] | None = None

    # --- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        self._check_open()
        encoded = self._tokenizer.encode(text, add_special_tokens=add_special)
        return [int(t) for t in encoded.input_ids.data[0]]

    def detokenize(self, tokens: Sequence[int]) -> str:
        self._check_open()
        return str(self._tokenizer.decode(list(tokens)))

    def _control_texts(self) -> tuple[str, ...]:
        """The special tokens of the Hugging Face tokenizer the IR was made from, and BOS,
        EOS and PAD (read once). OpenVINO's tokenizer has no switch to leave them
        unparsed, so message text that holds one is encoded in pieces
        (Session._text_tokens)."""
        if self._controls is None:
            self._check_open()
            texts = {
                self._tokenizer.get_bos_token(),
                self._tokenizer.get_eos_token(),
                self._tokenizer.get_pad_token(),
            } | special_token_texts(self._folder, self._tok_config)
            self._controls = tuple(sorted(t for t in texts if isinstance(t, str) and t))
        return self._controls

    # --- generation ---------------------------------------------------------------------

    def stream_tokens(
        self, prompt_tokens: Sequence[int], sampling: Sampling
    ) -> Iterator[StreamChunk]:
        self._check_open()
        if self._max_prompt is not None and len(prompt_tokens) > self._max_prompt:
            raise GenerationError(
                f"the prompt has {len(prompt_tokens)} tokens; this NPU pipeline was compiled for "
                f"at most {self._max_prompt}",
                hint="shorten the prompt, or load with a larger max_prompt_len",
            )
        if len(prompt_tokens) >= self._context:
            raise GenerationError(
                f"the prompt has {len(prompt_tokens)} tokens; the context holds {self._context}",
                hint="shorten the prompt or load with a larger context",
            )
        self._await_worker()  # an abandoned generation stops at its next token
        pipe = self._pipe
        config = configure(
            pipe.get_generation_config(), sampling, self._context - len(prompt_tokens)
        )
        inputs = tokenized_inputs(self._genai, prompt_tokens)
        run = PipelineRun(self._genai, self._tokenizer, sampling.stop, self._cancel)
        self._worker = run.start(lambda streamer: pipe.generate(inputs, config, streamer))
        yield from run.chunks(config.max_new_tokens)

    def _await_worker(self) -> None:
        """Wait for the last generation's pipeline thread: a stream closed early told it
        to stop at its next token, and did not wait for it."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.join()

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        self._check_open()
        if not isinstance(self._template, str):
            raise GenerationError(f"{self._folder} has no chat template", hint=NO_TEMPLATE_HINT)
        text = render_chat_template(
            self._template, messages, bos_token=self._bos, eos_token=self._eos
        )
        return text[len(self._bos) :] if self._bos and text.startswith(self._bos) else text

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position, from the IR run directly (the pipeline keeps none)."""
        import numpy as np
        import openvino as ov

        self._check_open()
        if self._compiled is None:
            core = ov.Core()
            model = core.read_model(self._folder / "openvino_model.xml")
            self._compiled = core.compile_model(
                model,
                self._device,
                {"INFERENCE_PRECISION_HINT": self.info.settings["inference_precision"]},
            )
        request = self._compiled.create_infer_request()
        request.reset_state()
        names = {i.get_any_name() for i in self._compiled.inputs}
        result = request.infer(logits_feed(tokens, names))
        return np.asarray(result[self._compiled.output(0)][0], dtype=np.float32)

    def clear_cache(self) -> None:
        """openvino-genai keeps the KV cache of the last generate() and reuses it when the
        next prompt starts the same way (a repeated prompt is 'prefilled' in ~10 ms). It
        has no call to drop it, so a one-token generation replaces the cached prefix: the
        next prompt then shares at most one token with the cache."""
        self._check_open()
        self._await_worker()
        if self._pipe is None:  # batched: the prefixes are the batch pipeline's to keep
            return
        config = self._pipe.get_generation_config()
        config.max_new_tokens, config.do_sample = 1, False
        self._pipe.generate(tokenized_inputs(self._genai, [0]), config)

    def _check_open(self) -> None:
        if self._closed:
            raise GenerationError("the session is closed", hint="load the model again")

    def _close(self) -> None:
        if not self._closed:
            self._await_worker()
            del self._pipe
            self._compiled = None
            self._closed = True
