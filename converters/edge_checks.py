"""Checks that conversion edges of several format packages share: the tools a step
imports when it runs, and the Hugging Face source it reads."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import TargetUnavailableError, UnsupportedConversionError
from edgekit.modelspec import ModelSpec
from edgekit.safetensors_header import model_file

# What a variant takes from its Hugging Face source beside the weights (tokenizer, chat
# template, generation defaults), byte for byte; never code (a source's *.py is what
# transformers imports under trust_remote_code).
HF_SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
MAX_SIDE_FILE = 256 << 20  # a tokenizer.json of a 256k vocabulary is ~35 MB
# read whole as JSON by the runtimes: a few hundred bytes in practice
MAX_GENERATION_CONFIG = 1 << 20


def hf_side_files(src: Path) -> list[Path]:
    """The HF_SIDE_FILES ``src`` has, each a regular file inside it of a bounded size.

    Raises:
        ModelFormatError: one is a link out of the folder, a FIFO...
        UnsupportedConversionError: one is implausibly large.
    """
    found = []
    for name in HF_SIDE_FILES:
        if not (src / name).exists() and not (src / name).is_symlink():
            continue
        checked = model_file(src, name)  # a regular file inside the folder
        size = checked.stat().st_size
        bound = MAX_GENERATION_CONFIG if name == "generation_config.json" else MAX_SIDE_FILE
        if size > bound:
            raise UnsupportedConversionError(
                f"{checked}: {size:,} bytes is not a plausible {name}",
                hint=f"a {name} is under {bound >> 20} MiB",
            )
        found.append(checked)
    return found


@dataclass(frozen=True, kw_only=True)
class Tool:
    """Importable modules one conversion step needs, and how to install them."""

    modules: tuple[str, ...]
    package: str  # what the user installs, in words: "llama-cpp-python"
    install: str  # the command: "pip install 'edgekit[gguf]'"


def require(tool: Tool, what: str) -> None:
    """``what`` (a step, in words) can run here: every module of ``tool`` is importable.

    Raises:
        TargetUnavailableError: one is not installed (the hint says how to install it).
    """
    for module in tool.modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package is missing or broken
            found = False
        if not found:
            raise TargetUnavailableError(
                f"{what} needs {tool.package} ({module} is not installed)", hint=tool.install
            )


def check_hf_weights(spec: ModelSpec, src: Path, what: str) -> None:
    """A conversion that reads a Hugging Face folder's safetensors weights.

    Raises:
        UnsupportedConversionError: ``src`` is not such a folder.
    """
    if spec.format != "hf" or spec.parameters_source != "tensors":
        raise UnsupportedConversionError(
            f"{src}: {what} needs a Hugging Face folder with safetensors weights",
            hint="a GGUF is converted with --to gguf --quant (requantize) or --to hf",
        )


def check_hf_tokenizer(src: Path) -> None:
    """A Hugging Face folder holds its tokenizer (an exporter copies it into the variant).

    Raises:
        UnsupportedConversionError: neither tokenizer.json nor tokenizer.model is there.
    """
    if not (src / "tokenizer.json").is_file() and not (src / "tokenizer.model").is_file():
        raise UnsupportedConversionError(
            f"{src}: no tokenizer (tokenizer.json or tokenizer.model)",
            hint="save the tokenizer beside the weights (tokenizer.save_pretrained) first",
        )
