"""Hostile tokenizer files and GGUF tokenizer metadata: a clear error, nothing written.

Two tables. The first edits a tiny model folder's tokenizer.json / tokenizer_config.json /
chat template and converts it to GGUF (the writer's reader, gguf_tokenizer.read_vocab);
the second writes a GGUF byte by byte with hostile tokenizer arrays or a tensor set that
does not match block_count and converts it to a Hugging Face folder (gguf_to_hf). Each
case checks the edgekit error type and its message, that nothing is left at the
destination or beside it, and that a sentinel folder is untouched; a subset also runs
through the CLI (exit code 1, no traceback).
"""

from __future__ import annotations

import json
import shutil
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from edgekit.errors import EdgekitError, ModelFormatError, UnsupportedConversionError
from tests.builders import full_tiny_gguf_tensors, gguf_bytes, tiny_gguf_metadata
from tests.conftest import require

Edit = Callable[[Path], None]


def _json_edit(name: str, change: Callable[[Any], Any]) -> Edit:
    def edit(folder: Path) -> None:
        path = folder / name
        value = change(json.loads(path.read_text(encoding="utf-8")))
        path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")

    return edit


def _tok(change: Callable[[dict[str, Any]], None]) -> Edit:
    def apply(spec: dict[str, Any]) -> dict[str, Any]:
        change(spec)
        return spec

    return _json_edit("tokenizer.json", apply)


def _raw(name: str, data: bytes) -> Edit:
    def edit(folder: Path) -> None:
        (folder / name).write_bytes(data)

    return edit


def _only_json_template(data: bytes) -> Edit:
    def edit(folder: Path) -> None:
        (folder / "chat_template.jinja").unlink()
        (folder / "chat_template.json").write_bytes(data)

    return edit


def _vocab_set(token: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["model"]["vocab"][token] = value

    return change


def _first_added(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["added_tokens"].append({**spec["added_tokens"][0], **fields})

    return change


def _drop_byte(spec: dict[str, Any]) -> None:
    spec["model"]["vocab"].pop("<0x41>")


def _template(single: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": single,
            "pair": single,
            "special_tokens": {},
        }

    return change


S, A = {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}


@dataclass(frozen=True)
class HfCase:
    name: str
    family: str
    edit: Edit
    error: type[EdgekitError]
    match: str


HF_CASES = [
    HfCase(
        "not-json",
        "mistral",
        _raw("tokenizer.json", b"\x00\xffnot json{"),
        ModelFormatError,
        "not UTF-8|not valid JSON",
    ),
    HfCase(
        "top-level-array",
        "mistral",
        _raw("tokenizer.json", b"[1, 2]"),
        ModelFormatError,
        "not an object",
    ),
    HfCase(
        "repeated-key",
        "mistral",
        _raw("tokenizer.json", b'{"model": {}, "model": {}}'),
        ModelFormatError,
        "twice",
    ),
    HfCase(
        "deep-nesting",
        "mistral",
        _raw("tokenizer.json", b'{"normalizer": ' + b"[" * 200000),
        ModelFormatError,
        "deeply|not valid JSON",
    ),
    HfCase(
        "vocab-is-a-list",
        "mistral",
        _tok(lambda s: s["model"].update(vocab=["a", "b"])),
        ModelFormatError,
        "model.vocab",
    ),
    HfCase("negative-id", "mistral", _tok(_vocab_set("▁the", -5)), ModelFormatError, "-5"),
    HfCase("string-id", "llama", _tok(_vocab_set("the", "7")), ModelFormatError, "has the id"),
    HfCase("shared-id", "mistral", _tok(_vocab_set("▁zzz", 300)), ModelFormatError, "share an id"),
    HfCase(
        "id-beyond-embeddings",
        "mistral",
        _tok(_vocab_set("▁zzz", 2_000_000)),
        UnsupportedConversionError,
        "embedding rows",
    ),
    HfCase(
        "added-conflicts-with-vocab",
        "mistral",
        _tok(_first_added(id=300, content="\x1b[31mred[/bold]")),
        ModelFormatError,
        "both",
    ),
    HfCase(
        "added-without-content",
        "llama",
        _tok(_first_added(content="")),
        ModelFormatError,
        "needs an id and a content",
    ),
    HfCase(
        "merge-of-three",
        "llama",
        _tok(lambda s: s["model"]["merges"].append(["a", "b", "c"])),
        ModelFormatError,
        "not two tokens",
    ),
    HfCase(
        "merge-with-a-space",
        "llama",
        _tok(lambda s: s["model"]["merges"].append(["a b", "c"])),
        UnsupportedConversionError,
        "space inside a token",
    ),
    HfCase(
        "merges-not-a-list",
        "llama",
        _tok(lambda s: s["model"].update(merges={"a": "b"})),
        ModelFormatError,
        "merges is not a list",
    ),
    HfCase("missing-byte-token", "gemma3", _tok(_drop_byte), UnsupportedConversionError, "<0x41>"),
    HfCase(
        "two-leading-specials",
        "mistral",
        _tok(_template([S, S, A])),
        UnsupportedConversionError,
        "at most one BOS",
    ),
    HfCase(
        "template-adds-unknown-token",
        "mistral",
        _tok(_template([{"SpecialToken": {"id": "<nope>", "type_id": 0}}, A])),
        ModelFormatError,
        "not a token",
    ),
    HfCase(
        "template-without-sequence",
        "mistral",
        _tok(_template([S])),
        ModelFormatError,
        "specials around",
    ),
    HfCase(
        "roberta-post-processor",
        "llama",
        _tok(lambda s: s.update(post_processor={"type": "RobertaProcessing"})),
        UnsupportedConversionError,
        "RobertaProcessing",
    ),
    HfCase(
        "byte-level-lowercase",
        "qwen2",
        _tok(lambda s: s.update(normalizer={"type": "Lowercase"})),
        UnsupportedConversionError,
        "does not normalize",
    ),
    HfCase(
        "spm-strip-normalizer",
        "mistral",
        _tok(lambda s: s["normalizer"]["normalizers"].append({"type": "Strip"})),
        UnsupportedConversionError,
        "llama.cpp",
    ),
    HfCase(
        "normalizer-not-an-object",
        "mistral",
        _tok(lambda s: s.update(normalizer=[1])),
        ModelFormatError,
        "not an object",
    ),
    HfCase(
        "wordpiece",
        "llama",
        _tok(lambda s: s["model"].update(type="WordPiece")),
        UnsupportedConversionError,
        "WordPiece",
    ),
    HfCase(
        "tokenizer-config-garbage",
        "mistral",
        _raw("tokenizer_config.json", b"{bos: <s>}"),
        ModelFormatError,
        "tokenizer_config.json",
    ),
    HfCase(
        "chat-template-json-garbage",
        "qwen3",
        _only_json_template(b"[[["),
        ModelFormatError,
        "chat_template.json",
    ),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    require("torch", "tiny models are built with transformers")
    require("transformers", "tiny models are built with transformers")
    require("gguf", "the GGUF writer is gguf-py's")
    from tests.tiny_models import build_tiny_model

    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build_tiny_model(family, tmp_path_factory.mktemp(family), layers=1)
        return cache[family]

    return get


def _sentinel(tmp_path: Path) -> Path:
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep.txt").write_text("untouched")
    return sentinel


def _nothing_written(tmp_path: Path, out: Path, sentinel: Path) -> None:
    assert not out.exists()
    leftovers = [
        p.name for p in tmp_path.iterdir() if ".partial-" in p.name or "intermediate" in p.name
    ]
    assert not leftovers, leftovers
    assert [p.name for p in sentinel.iterdir()] == ["keep.txt"]
    assert (sentinel / "keep.txt").read_text() == "untouched"


@pytest.mark.parametrize("case", HF_CASES, ids=lambda c: c.name)
def test_hostile_hugging_face_tokenizer(
    tiny: Callable[[str], Path], tmp_path: Path, case: HfCase
) -> None:
    from edgekit.converters.convert import convert_model

    src = tmp_path / "src"
    shutil.copytree(tiny(case.family), src)
    case.edit(src)
    sentinel = _sentinel(tmp_path)
    out = tmp_path / "out.gguf"
    with pytest.raises(case.error, match=case.match) as info:
        convert_model(src, "gguf", out, quant="F16")
    assert info.value.hint, "a hint says what to do"
    assert "\x1b" not in str(info.value)
    _nothing_written(tmp_path, out, sentinel)


def test_tokenizer_json_size_is_bounded(
    tiny: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.converters.convert import convert_model
    from edgekit.converters.gguf.tokenizer import to_gguf as gguf_tokenizer

    monkeypatch.setattr(gguf_tokenizer, "MAX_TOKENIZER_BYTES", 1000, raising=False)
    sentinel = _sentinel(tmp_path)
    out = tmp_path / "out.gguf"
    with pytest.raises(ModelFormatError, match="larger than"):
        convert_model(tiny("mistral"), "gguf", out, quant="F16")
    _nothing_written(tmp_path, out, sentinel)


# --- GGUF -> Hugging Face ----------------------------------------------------------------

_BYTES = [f"<0x{b:02X}>" for b in range(256)]
_SPM_TOKENS = ["<unk>", "<s>", "</s>", *_BYTES, "▁a", "a", "b"]


def _spm_metadata(**changes: Any) -> dict[str, Any]:
    meta = tiny_gguf_metadata("llama")
    n = len(_SPM_TOKENS)
    meta.update(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": list(_SPM_TOKENS),
            "tokenizer.ggml.scores": [0.0] * n,
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1, 1, 1],
        }
    )
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return meta


@dataclass(frozen=True)
class GgufCase:
    name: str
    metadata: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], int]]
    error: type[EdgekitError]
    match: str


_N = len(_SPM_TOKENS)
GGUF_CASES = [
    # 200k layers: enough to show the per-layer tables being built, not enough to hurt
    GgufCase(
        "block-count-huge",
        _spm_metadata(**{"llama.block_count": 200_000}),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "block_count",
    ),
    GgufCase(
        "block-count-above-tensors",
        _spm_metadata(**{"llama.block_count": 3}),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "block_count.*3",
    ),
    GgufCase(
        "tensor-beyond-block-count",
        _spm_metadata(),
        {**full_tiny_gguf_tensors(vocab=_N), "blk.7.attn_q.weight": ((64, 64), 0)},
        ModelFormatError,
        "blk.7",
    ),
    GgufCase(
        "missing-tensor",
        _spm_metadata(),
        {k: v for k, v in full_tiny_gguf_tensors(vocab=_N).items() if k != "blk.0.ffn_up.weight"},
        ModelFormatError,
        "missing",
    ),
    GgufCase(
        "wrong-shape",
        _spm_metadata(),
        {**full_tiny_gguf_tensors(vocab=_N), "blk.0.attn_k.weight": ((48, 64), 0)},
        ModelFormatError,
        "shape",
    ),
    GgufCase(
        "duplicate-tokens",
        _spm_metadata(
            **{"tokenizer__ggml__tokens": ["<unk>", "<s>", "</s>", *_BYTES, "a", "a", "b"]}
        ),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "twice",
    ),
    GgufCase(
        "token-types-short",
        _spm_metadata(**{"tokenizer__ggml__token_type": [1, 1]}),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "token_type",
    ),
    GgufCase(
        "token-types-strings",
        _spm_metadata(**{"tokenizer__ggml__token_type": ["x"] * _N}),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "token_type",
    ),
    GgufCase(
        "spm-without-scores",
        _spm_metadata(**{"tokenizer__ggml__scores": None}),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "scores",
    ),
    GgufCase(
        "scores-short",
        _spm_metadata(**{"tokenizer__ggml__scores": [0.5]}),
        full_tiny_gguf_tensors(vocab=_N),
        ModelFormatError,
        "scores",
    ),
    GgufCase(
        "bert-tokenizer",
        _spm_metadata(**{"tokenizer__ggml__model": "bert"}),
        full_tiny_gguf_tensors(vocab=_N),
        UnsupportedConversionError,
        "bert",
    ),
    GgufCase(
        "unknown-pre",
        _spm_metadata(
            **{
                "tokenizer__ggml__model": "gpt2",
                "tokenizer__ggml__pre": "\x1b]8;;x\x07evil",
                "tokenizer__ggml__scores": None,
            }
        ),
        full_tiny_gguf_tensors(vocab=_N),
        UnsupportedConversionError,
        "pre-tokenizer",
    ),
]


@pytest.mark.parametrize("case", GGUF_CASES, ids=lambda c: c.name)
def test_hostile_gguf_to_hugging_face(tmp_path: Path, case: GgufCase) -> None:
    require("gguf", "dequantizing uses gguf-py")
    from edgekit.converters.convert import convert_model

    src = tmp_path / "m.gguf"
    src.write_bytes(gguf_bytes(case.metadata, case.tensors))
    sentinel = _sentinel(tmp_path)
    out = tmp_path / "hf"
    with pytest.raises(case.error, match=case.match) as info:
        convert_model(src, "hf", out)
    assert "\x1b" not in str(info.value)
    _nothing_written(tmp_path, out, sentinel)


def test_block_count_of_2_to_the_32_allocates_nothing(tmp_path: Path) -> None:
    """The issue's case: a 10 KB GGUF claiming 2^32-1 layers is refused at once."""
    require("gguf", "dequantizing uses gguf-py")
    from edgekit.converters.convert import convert_model

    src = tmp_path / "m.gguf"
    src.write_bytes(
        gguf_bytes(
            _spm_metadata(**{"llama.block_count": 2**32 - 1}), full_tiny_gguf_tensors(vocab=_N)
        )
    )
    tracemalloc.start()
    try:
        with pytest.raises(EdgekitError, match="block_count|layers"):
            convert_model(src, "hf", tmp_path / "hf")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "case", [GGUF_CASES[0], GGUF_CASES[5], GGUF_CASES[11]], ids=lambda c: c.name
)
def test_hostile_gguf_through_the_cli(tmp_path: Path, case: GgufCase) -> None:
    require("gguf", "dequantizing uses gguf-py")
    from edgekit.cli import main

    src = tmp_path / "m.gguf"
    src.write_bytes(gguf_bytes(case.metadata, case.tensors))
    sentinel = _sentinel(tmp_path)
    out = tmp_path / "hf"
    result = CliRunner().invoke(main, ["convert", str(src), "--to", "hf", "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "error:" in result.output
    assert "\x1b" not in result.output
    _nothing_written(tmp_path, out, sentinel)


def test_hostile_tokenizer_through_the_cli(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    from edgekit.cli import main

    src = tmp_path / "src"
    shutil.copytree(tiny("mistral"), src)
    _tok(_first_added(id=300, content="\x1b[31mred[/bold]"))(src)
    sentinel = _sentinel(tmp_path)
    out = tmp_path / "out.gguf"
    result = CliRunner().invoke(main, ["convert", str(src), "--to", "gguf", "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "error:" in result.output
    assert "\x1b" not in result.output
    _nothing_written(tmp_path, out, sentinel)
