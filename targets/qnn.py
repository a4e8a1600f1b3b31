"""ONNX variants through ONNX Runtime GenAI: on the CPU execution provider anywhere, and on
a Snapdragon's Hexagon NPU (HTP) through Qualcomm's QNN execution provider.

Which provider runs a variant (``pick_provider``): the QNN provider when it is present
here (onnxruntime-qnn registered, or built in) AND the variant is a context-binary
(EPContext) variant, whose genai_config.json names the QNN provider and whose graphs are
EPContext wrappers, compiled for this SoC when both say which; otherwise the CPU provider.
``device="npu"`` without both is refused with the reason; ``device="cpu"`` on a
context-binary variant too (only the HTP runs those), and ``auto`` on one where no HTP is
(an x86 host: only the HTP of the SoC it was compiled for runs it). The QDQ stage of an
HTP variant (the static pipeline before compilation) runs on the CPU provider, so its
output can be checked here. The session says which ran (``SessionInfo.unit`` and
``settings["provider"]``).

Planning: the CPU unit plans the CPU variants (INT4, INT8); the NPU unit the HTP
variants edgekit builds (W8A16, FP16: converters/onnx/htp_*).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgekit.converters.formats import Format
from edgekit.converters.onnx import FORMAT
from edgekit.converters.onnx.socs import SOCS
from edgekit.targets import checks, qnn_host
from edgekit.targets.contract import Coefficients, HostDevice, Target, UnitSupport
from edgekit.targets.onnx_folder import GenaiFolder, read_folder
from edgekit.targets.onnx_runtime import GenaiSession, Provider

from edgekit.errors import TargetUnavailableError, UnsupportedConversionError

if TYPE_CHECKING:
    from edgekit.devices import Accelerator, DeviceProfile

MB = 1 << 20
SETTINGS = ("device", "context", "threads", "logits")
DEVICES = ("auto", "cpu", "npu")
CPU = Provider(
    label="cpu", unit="cpu", execution_provider="CPUExecutionProvider", keep_config=False
)
HTP = Provider(label="qnn", unit="npu", execution_provider=qnn_host.EP_NAME, keep_config=True)
NPU_HINT = (
    "the HTP runs context-binary variants built for it (edgekit pack --device "
    "galaxy-s25-ultra) on a Snapdragon with onnxruntime-qnn; load with device='cpu' to "
    "run a CPU variant here"
)


class QnnTarget(Target):
    """ONNX Runtime GenAI folders: the CPU provider anywhere, the QNN HTP on Snapdragon."""

    name: ClassVar[str] = "qnn"
    display_name: ClassVar[str] = "ONNX Runtime (CPU; Qualcomm QNN on Snapdragon)"
    devices: ClassVar[str] = (
        "any CPU (ONNX Runtime's CPU provider); Snapdragon phones and laptops (Hexagon NPU "
        "through the QNN execution provider)"
    )
    format: ClassVar[Format] = FORMAT
    install_hint: ClassVar[str] = "pip install 'edgekit[onnx]'"
    # tokenizers: the session tokenizes with Hugging Face's (onnx_runtime.py says why)
    sdk_modules: ClassVar[tuple[str, ...]] = ("onnxruntime", "onnxruntime_genai", "tokenizers")
    distribution: ClassVar[str] = "onnxruntime-genai"
    priority: ClassVar[int] = 20
    load_settings: ClassVar[tuple[str, ...]] = SETTINGS
    devices_accepted: ClassVar[tuple[str, ...]] = DEVICES
    # First estimates; reasoning, in order of the fields:
    #  CPU: speed measured here (docs/onnx.md, "Measured on this host"): SmolLM2-135M INT4
    #    decoding 53-61 tok/s reads 89.2 MB per token, 21-24% of the host's 23 GB/s;
    #    prefill 118 tok/s at 287.7 MFLOP per token, 21% of its 0.16 TFLOPS fp32 peak
    #    (on a 2-core VM shared with other work: lower bounds). Memory measured here
    #    (RSS after load): the tiny model 55.6 MB over the imported process,
    #    SmolLM2-135M INT4 (86.5 MB of weights)
    #    232.1 MB: ~56 MB of runtime and ~2.0 bytes resident per weight byte (ONNX
    #    Runtime reads the external data and keeps MatMulNBits' prepacked copy); the KV
    #    cache of a generation is allocated at its maximum length
    #    (past_present_share_buffer).
    #  NPU: no measurement here: bandwidth efficiency from public token-generation figures,
    #    lower than a GPU's (NPU LLM pipelines are younger); ~200 MB of HTP shared buffers;
    #    static shapes, so the KV cache is sized when the graph is compiled.
    units: ClassVar[tuple[UnitSupport, ...]] = (
        UnitSupport(
            kind="cpu",
            formats=("INT8", "INT4"),
            priors=Coefficients(
                bandwidth_efficiency=0.24,
                token_overhead_s=0.0005,
                compute_efficiency=0.21,
                runtime_bytes=56 * MB,
                weight_residency=2.0,
                kv_preallocated=True,
            ),
        ),
        UnitSupport(
            kind="npu",
            # the HTP variants: static-shape QDQ (or float, run at fp16) graphs compiled
            # to context binaries for one SoC; the CPU variants do not run on the HTP
            formats=("W16A16", "W8A16", "FP16"),
            # parts of at most the HTP's per-session limit (the recipe's part_gib)
            splits_model=True,
            priors=Coefficients(
                bandwidth_efficiency=0.4,
                token_overhead_s=0.003,
                compute_efficiency=0.2,
                runtime_bytes=200 * MB,
                weight_residency=1.0,
                kv_preallocated=True,
            ),
        ),
    )

    @classmethod
    def accelerators(cls, profile: DeviceProfile) -> list[Accelerator]:
        """The device's CPU (the CPU provider runs everywhere) and its Hexagon tensor
        processor (runtime device ``HTP``)."""
        return [a for a in profile.accelerators if a.kind == "cpu" or a.runtime_device == "HTP"]

    @classmethod
    def build_recipe(cls, profile: DeviceProfile, accelerator: Accelerator) -> str:
        """An HTP variant is compiled for one SoC, in parts of at most the HTP's
        per-session limit: ``soc=<part>,part_gib=<max_model_gib>`` from the profile.

        Raises:
            UnsupportedConversionError: the profile's HTP names no SoC edgekit compiles
                for (the plan marks its candidates prediction-only with this message).
        """
        if accelerator.runtime_device != "HTP":
            return ""
        if accelerator.soc is None or accelerator.soc not in SOCS:
            raise UnsupportedConversionError(
                f"{profile.name}: its {accelerator.name} names "
                + (f"SoC {accelerator.soc}, " if accelerator.soc else "no SoC, ")
                + "not one edgekit compiles HTP variants for",
                hint=f"edgekit compiles for {', '.join(SOCS)} (the profile's soc field)",
            )
        options = [f"soc={accelerator.soc}"]
        if accelerator.max_model_gib is not None:
            options.append(f"part_gib={accelerator.max_model_gib:g}")
        return ",".join(options)

    @classmethod
    def build_note(cls, kind: str) -> str:
        """An HTP build's last step (the context binaries) needs onnxruntime-qnn here, and
        what it makes only runs on the Snapdragon."""
        if kind != "npu":
            return ""
        if importlib.util.find_spec(qnn_host.PLUGIN_MODULE) is None:
            return (
                f"{qnn_host.PLUGIN_MODULE} is not installed here, so pack ships the QDQ "
                "stage uncompiled (it runs on the CPU provider, not on the HTP); pip "
                "install 'edgekit[qnn]' to compile the context binaries"
            )
        return (
            "compiled here into QNN context binaries, which only the Snapdragon's HTP "
            "runs (not run on this host)"
        )

    @classmethod
    def check_host(cls) -> tuple[bool, str]:
        """Usable wherever onnxruntime-genai imports (the CPU provider); says ONNX
        Runtime's providers, the onnxruntime-qnn plug-in and QNN SDK, and on a Snapdragon
        its SoC and HTP architecture."""
        import onnxruntime as ort
        import onnxruntime_genai  # noqa: F401 - the runtime the sessions use

        found = qnn_host.plugin(ort)
        parts = [f"providers: {', '.join(ort.get_available_providers())}", found.describe()]
        soc = qnn_host.host_soc()
        if soc is not None:
            parts.append(f"{soc.name}: HTP v{soc.htp_arch}")
        parts.append(
            "QNN HTP present"
            if qnn_host.qnn_present(ort)
            else "no QNN HTP here: variants run on the CPU provider"
        )
        return True, "; ".join(parts)

    @classmethod
    def host_devices(cls) -> tuple[HostDevice, ...]:
        """The NPUs and GPUs ONNX Runtime's execution providers list here (the QNN HTP as
        ``HTP``, which the device profiles call it)."""
        import onnxruntime as ort

        qnn_host.plugin(ort)
        found = []
        for ep_device in ort.get_ep_devices():
            hardware = ep_device.device
            kind = qnn_host.device_kind(hardware)
            if kind not in ("npu", "gpu"):
                continue
            qnn = ep_device.ep_name == qnn_host.EP_NAME and kind == "npu"
            found.append(
                HostDevice(
                    kind="npu" if kind == "npu" else "gpu",
                    device="HTP" if qnn else ep_device.ep_name,
                    name=f"{hardware.vendor} {kind.upper()} ({ep_device.ep_name})",
                )
            )
        return tuple(found)

    @classmethod
    def load_unit(cls, device: str, model: str | Path | None = None) -> str:
        """Given a variant folder, ``auto`` is the NPU for a context-binary variant (only
        the HTP runs it) and the CPU otherwise (a CPU variant, an HTP variant's QDQ
        stage). Without one (the contract passes none) the QNN provider's presence here
        decides."""
        if device in ("cpu", "npu"):
            return device
        if model is not None:
            return "npu" if _compiled(read_folder(Path(model))) else "cpu"
        try:
            import onnxruntime as ort
        except ImportError:  # pack sizes variants on hosts without the SDK
            return "cpu"
        return "npu" if qnn_host.qnn_present(ort) else "cpu"

    @classmethod
    def variant_runs_here(cls, model: Path, device: str) -> str:
        """A context-binary variant runs only on the HTP of its SoC: the reason the
        provider pick would refuse it with, else ""."""
        folder = read_folder(Path(model))
        if not _compiled(folder) and device != "npu":
            return ""
        try:
            pick_provider(device if device in DEVICES else "auto", folder)
        except TargetUnavailableError as exc:
            return exc.message
        return ""

    @classmethod
    def device_settings(cls, device: str) -> dict[str, Any]:
        super().device_settings(device)  # refuses a device this target does not know
        return {"device": device}

    @classmethod
    def load(cls, model: str | Path, **settings: Any) -> GenaiSession:
        """Load an ONNX Runtime GenAI folder (genai_config.json, model.onnx, tokenizer).

        Settings: ``device`` (auto, cpu, npu), ``context`` (tokens, up to the context the
        model was exported for), ``threads`` (ONNX Runtime's intra-op threads), ``logits``.

        Raises:
            SettingError: an unknown setting, or one of the wrong type or out of range.
            TargetUnavailableError: onnxruntime-genai missing; the NPU asked for without
                the QNN provider or a context-binary variant.
            ModelNotFoundError, ModelFormatError: not an ONNX Runtime GenAI folder.
            GenerationError: ONNX Runtime refused the model.
        """
        checks.known_settings(settings, SETTINGS, what="ONNX Runtime setting")
        given = {k: v for k, v in settings.items() if v is not None}  # None: the default
        device = checks.choice("device", given.pop("device", "auto"), DEVICES)
        folder = read_folder(Path(model))
        provider = pick_provider(device, folder)
        if provider is HTP:
            import onnxruntime as ort
            import onnxruntime_genai as og

            qnn_host.register_with_genai(og, qnn_host.plugin(ort))
        return GenaiSession(folder, target=cls.name, provider=provider, **given)


def pick_provider(device: str, folder: GenaiFolder) -> Provider:
    """The provider that runs ``folder`` for ``device`` (see the module text).

    Raises:
        TargetUnavailableError: the NPU asked for and not possible here, or a
            context-binary variant that only the HTP runs, with no HTP here.
    """
    compiled = _compiled(folder)
    if device == "cpu":
        if compiled:
            raise TargetUnavailableError(
                f"{folder.path} holds QNN context binaries{_for_soc(folder)}: only the HTP "
                "runs them, not the CPU provider",
                hint="load it with device='npu' on that Snapdragon, or use a CPU variant "
                "(or the HTP variant's QDQ stage) here",
            )
        return CPU
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise TargetUnavailableError(
            "onnxruntime is not installed", hint=QnnTarget.install_hint
        ) from exc
    present = qnn_host.qnn_present(ort)
    why = _why_not_htp(folder, compiled, present, ort)
    if why is None:
        return HTP
    if device == "npu" or compiled:
        only = f" (only the HTP{_for_soc(folder)} runs it)" if compiled else ""
        raise TargetUnavailableError(
            f"{folder.path} cannot run on the QNN HTP{only}: {why}", hint=NPU_HINT
        )
    return CPU


def _compiled(folder: GenaiFolder) -> bool:
    """A context-binary variant: it names the QNN provider and its stages that name a
    provider are EPContext wrappers."""
    return folder.names_provider("qnn", qnn_host.EP_NAME) and folder.holds_ep_context()


def _for_soc(folder: GenaiFolder) -> str:
    """ " for Snapdragon 8 Elite (SM8750)", from the soc_model its provider options name."""
    options = {k: v for opts in folder.provider_options.values() for k, v in opts.items()}
    wanted = options.get("soc_model")
    soc = qnn_host.soc_named(wanted) if wanted else None
    if soc is not None:
        return f" compiled for the {soc.name} ({soc.key})"
    return f" compiled for QNN soc_model {wanted}" if wanted else ""


def _why_not_htp(folder: GenaiFolder, compiled: bool, present: bool, ort: Any) -> str | None:
    """Why the HTP cannot run ``folder`` here (None: it can)."""
    if not present:
        found = qnn_host.plugin(ort)
        if found.registered:
            return (
                f"{found.describe()}, but {qnn_host.EP_NAME} lists no NPU (HTP) device here: "
                "this is not a Snapdragon"
            )
        providers = ", ".join(ort.get_available_providers())
        return (
            f"ONNX Runtime has no {qnn_host.EP_NAME} here ({found.describe()}; "
            f"providers: {providers})"
        )
    if not compiled:
        return "it is not a context-binary (EPContext) variant for the QNN provider"
    options = {k: v for opts in folder.provider_options.values() for k, v in opts.items()}
    soc = qnn_host.host_soc()
    wanted = options.get("soc_model")
    if soc is not None and wanted and wanted != str(soc.soc_model):
        return f"it was{_for_soc(folder)}; this is the {soc.name} ({soc.key})"
    return None
