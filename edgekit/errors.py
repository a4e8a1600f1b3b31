"""Every error edgekit raises, in one place.

Each error carries what went wrong (the message), and what to do about it (``hint``).
Backend exceptions are translated at the boundary (``raise ModelFormatError(...) from exc``),
so callers catch edgekit errors only, and the CLI renders any of them as one short screen
and a non-zero exit code.

Hierarchy::

    EdgekitError
    ├── ModelError                  a model could not be read or is not supported
    │   ├── ModelNotFoundError      the path does not exist or holds no model
    │   ├── ModelFormatError        a file is corrupt, truncated or of the wrong kind
    │   ├── UnsafeModelError        a pickle checkpoint (loading it would run code)
    │   └── UnsupportedArchitectureError
    ├── SchemaError                 a TOML/JSON document does not match its schema
    ├── ProfileError                a device profile is missing or invalid
    │   ├── ProfileNotFoundError
    │   └── ProfileSchemaError      (also a SchemaError)
    ├── BundleError                 a bundle is missing, invalid or tampered with
    │   ├── BundleNotFoundError
    │   ├── BundleSchemaError       (also a SchemaError) unknown version, keys or types
    │   ├── BundleIntegrityError    a file is missing, or its size or checksum differs
    │   ├── UnsafeArchiveError      an archive member escapes, links out, or is too big
    │   └── NoUsableVariantError    no variant can run on this host
    ├── ProbeError                  a host probe part failed (the probe itself reports, not raises)
    ├── EvalError                   an accuracy evaluation cannot be made as asked
    ├── PlanError                   a plan cannot be made as asked (bad budget, no target)
    ├── BenchStoppedError           a benchmark was stopped before it finished
    ├── ServeError                  `edgekit serve` refuses to start as configured (an empty
    │   │                           API key, no key beyond loopback without --insecure-no-auth)
    │   └── RequestError            an HTTP request to the server is malformed or not allowed
    ├── WriteError                  a file or folder could not be written (no space, read-only,
    │                               something in the way); nothing partial is left
    ├── ConversionError             a conversion or quantization failed
    │   ├── UnsupportedConversionError  the source, format or option cannot be converted
    │   ├── QualityError            a variant measured worse than --max-quality-loss
    │   └── OutputExistsError       the output path exists and --force was not given
    └── TargetError                 a runtime target is unknown or cannot run here
        ├── TargetUnavailableError  its SDK or hardware is missing
        ├── InsufficientMemoryError the model is predicted not to fit in memory
        ├── GenerationError         the runtime failed while loading or generating
        └── SettingError            a load setting or call argument is invalid (also a ValueError)
"""

from __future__ import annotations


class EdgekitError(Exception):
    """Base class: a message for what went wrong and a hint for what to do."""

    default_hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message

    def to_dict(self) -> dict[str, str]:
        """The error as JSON-ready data, for ``--json`` output."""
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


class ModelError(EdgekitError):
    """A model could not be read or is not supported."""


class ModelNotFoundError(ModelError):
    """The path does not exist, or holds nothing edgekit recognises as a model."""

    default_hint = "pass a Hugging Face model folder (config.json + *.safetensors) or a .gguf file"


class ModelFormatError(ModelError):
    """A model file is corrupt, truncated, or not the format its name claims."""

    default_hint = "the file may be incomplete: download or export it again"


class UnsafeModelError(ModelError):
    """A checkpoint that can only be read by unpickling, which runs arbitrary code."""

    default_hint = (
        "convert it to safetensors in a trusted environment first, e.g. "
        "AutoModelForCausalLM.from_pretrained(path).save_pretrained(out, safe_serialization=True)"
    )


class UnsupportedArchitectureError(ModelError):
    """The model's architecture is not one edgekit knows how to handle."""


class SchemaError(EdgekitError):
    """A TOML or JSON document does not match its schema."""


class ProfileError(EdgekitError):
    """A device profile is missing or invalid."""


class ProfileNotFoundError(ProfileError):
    """No device profile of that name."""

    default_hint = "run `edgekit profiles` to list the known devices"


class ProfileSchemaError(ProfileError, SchemaError):
    """A device profile file does not match the schema."""

    default_hint = "see docs/profiles.md for the profile schema"


class BundleError(EdgekitError):
    """A bundle is missing, invalid, or has been tampered with."""


class BundleNotFoundError(BundleError):
    default_hint = "pass a bundle folder (with manifest.json) or a bundle .tar archive"


class BundleSchemaError(BundleError, SchemaError):
    default_hint = "see docs/bundle.md and docs/bundle.schema.json"


class BundleIntegrityError(BundleError):
    default_hint = "the bundle was modified or damaged after packing: pack it again"


class UnsafeArchiveError(BundleError):
    default_hint = "only open archives from sources you trust; this one was refused"


class NoUsableVariantError(BundleError):
    """No variant of the bundle can run on this host."""


class ProbeError(EdgekitError):
    """One part of the host probe failed; the probe reports these rather than raising."""


class EvalError(EdgekitError):
    """An accuracy evaluation cannot be made as asked (tokenizers differ, text too short)."""


class PlanError(EdgekitError):
    """A plan cannot be made as asked: an impossible budget or a device with no target."""


class BenchStoppedError(EdgekitError):
    """A benchmark was stopped (its ``stop`` event was set) before it finished."""


class ServeError(EdgekitError):
    """``edgekit serve`` refuses to start as configured: an empty API key, or no key on an
    address beyond loopback without ``--insecure-no-auth``."""


class RequestError(ServeError):
    """An HTTP request to ``edgekit serve`` does not match the OpenAI schema or this
    server's limits; the server answers it with a 4xx JSON error naming ``param``."""

    def __init__(self, message: str, *, param: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.param = param


class WriteError(EdgekitError):
    """A file or folder could not be written: no space left, a read-only or full disk, no
    permission, or a folder or link in the way. Nothing partial is left at the destination."""

    default_hint = "free some space or choose another output path, then run it again"


class ConversionError(EdgekitError):
    """A conversion or quantization failed; nothing was written at the destination."""


class QualityError(ConversionError):
    """A packed variant measured a larger quality loss than allowed."""


class UnsupportedConversionError(ConversionError):
    """The source, the format or an option cannot be converted (checked before writing)."""


class OutputExistsError(ConversionError):
    """The output path exists and overwriting was not asked for."""


class TargetError(EdgekitError):
    """A runtime target is unknown or cannot run here."""


class TargetUnavailableError(TargetError):
    """The target's SDK or hardware is not present on this host."""


class InsufficientMemoryError(TargetError):
    """The model is predicted not to fit in the memory available."""


class GenerationError(TargetError):
    """The runtime failed while loading a model or generating."""


class SettingError(TargetError, ValueError):
    """A load setting or a call argument (sampling, prompt, token ids, messages) is of the
    wrong type or out of range. Checked before the runtime sees it; the message names the
    valid range. Also a ValueError, so code that catches bad arguments that way still does."""


class BatchSettingError(SettingError):
    """A setting the target's batched runtime cannot honour (a quantized KV cache its batch
    lacks): the same load without ``parallel`` takes it."""
