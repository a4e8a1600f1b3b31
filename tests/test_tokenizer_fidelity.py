"""Token for token: every family's GGUF tokenizes like its Hugging Face tokenizer.

For each supported family a tiny model is built with the structure of the family's real
tokenizer.json (tests/tiny_models.py), converted to GGUF by edgekit, and loaded by
llama.cpp (vocabulary only). A multilingual text (English, accented Latin, Greek, Cyrillic,
CJK, emoji, digit runs, whitespace runs, tabs and newlines) with the family's special
tokens in it must give exactly the ids of the Hugging Face tokenizer, special tokens parsed
as Hugging Face parses them (llama.cpp with ``special=True``), BOS/EOS added as each adds
them. The reference is the tokenizer.json read by ``tokenizers`` and by transformers'
AutoTokenizer; the test first checks that the two agree.

The way back is held to the same standard: the GGUF converted to a Hugging Face folder
(``convert --to hf``) tokenizes the text exactly as the original folder.
"""

from __future__ import annotations

import difflib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.tiny_models import STYLES

BODY = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife.\n"
    "Café, naïve, façade — déjà vu in São Paulo; Ångström, Straße, Kraków, coöperate.\n"
    "Ελληνικά: καλημέρα κόσμε. Русский: Привет, мир! Съешь же ещё этих булок.\n"
    "中文：我们在东京见面。日本語のテキスト。한국어 문장도 있습니다.\n"
    "Emoji 🙂 👍🏽 🚀🚀, digits 1234567 and 3.14159, 2026-04-01, 1,000,000.\n"
    "Whitespace:  two,   three,\t\ttabs,\n\n\nnewlines,\r\nCRLF, trailing   \n"
    "    an indented line and one without a newline"
)


def family_texts(family: str) -> list[str]:
    """The test texts for ``family``: the body alone, after a leading space, framed by the
    family's special tokens (at the start, mid-text, adjacent, followed by a space and by
    a newline), and the degenerate ones (empty, whitespace only)."""
    style = STYLES[family]
    added = [t.content for t in (*style.head, *style.after_bytes, *style.tail)]
    marks = [t for t in added if t.startswith(("<", "[")) and t not in ("<unk>",)]
    first, second, third = (marks * 3)[:3]
    return [
        BODY,
        " " + BODY,
        f"{first}user\n{BODY}{second} {third}\n\nthe end",
        f"{first}{second}{third}  after three specials{first}",
        f"word{second}\nword {third} word",
        "",
        "   \n\t ",
        "<unk> is a word here, and so is <s> once",
    ]


def _diff(ours: list[int], theirs: list[int]) -> str:
    matcher = difflib.SequenceMatcher(a=theirs, b=ours, autojunk=False)
    changed = sum(
        max(i2 - i1, j2 - j1) for op, i1, i2, j1, j2 in matcher.get_opcodes() if op != "equal"
    )
    first = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), None)
    if first is None:
        first = min(len(ours), len(theirs))
    return (
        f"{changed} of {len(theirs)} tokens differ (first at {first}): "
        f"hf={theirs[max(0, first - 2) : first + 4]} gguf={ours[max(0, first - 2) : first + 4]}"
    )


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    require("torch", "tiny models are built with transformers")
    require("transformers", "tiny models are built with transformers")
    require("llama_cpp", "the GGUF tokenizer is llama.cpp's")
    from tests.tiny_models import build_tiny_model

    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build_tiny_model(
                family, tmp_path_factory.mktemp(f"tok-{family}"), layers=1
            )
        return cache[family]

    return get


class HfTokenizer:
    """The reference: tokenizer.json through ``tokenizers`` and through AutoTokenizer, which
    must agree with each other before either is compared with anything."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        self.raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.auto = AutoTokenizer.from_pretrained(folder)

    def ids(self, text: str) -> list[int]:
        raw = list(self.raw.encode(text).ids)
        auto = list(self.auto(text)["input_ids"])
        assert raw == auto, f"tokenizers and transformers disagree on {text!r}"
        return raw


class GgufTokenizer:
    def __init__(self, path: Path) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def ids(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def close(self) -> None:
        self.llm.close()


def _gguf(src: Path, out: Path) -> Path:
    from edgekit.converters.convert import convert_model

    convert_model(src, "gguf", out, quant="F32")
    return out


def _mismatches(family: str, ours: Any, reference: HfTokenizer) -> list[str]:
    problems = []
    for text in family_texts(family):
        expected, got = reference.ids(text), ours.ids(text)
        if got != expected:
            problems.append(f"{text[:40]!r}: {_diff(got, expected)}")
    return problems


@pytest.mark.parametrize("family", sorted(STYLES))
def test_gguf_tokenizes_like_hugging_face(
    tiny_folders: Callable[[str], Path], tmp_path: Path, family: str
) -> None:
    src = tiny_folders(family)
    reference = HfTokenizer(src)
    ours = GgufTokenizer(_gguf(src, tmp_path / f"{family}.gguf"))
    try:
        problems = _mismatches(family, ours, reference)
    finally:
        ours.close()
    assert not problems, f"{family}: " + "; ".join(problems)


@pytest.mark.parametrize("family", sorted(STYLES))
def test_gguf_back_to_hugging_face_tokenizes_like_the_original(
    tiny_folders: Callable[[str], Path], tmp_path: Path, family: str
) -> None:
    from edgekit.converters.convert import convert_model

    src = tiny_folders(family)
    gguf = _gguf(src, tmp_path / f"{family}.gguf")
    back = tmp_path / "hf"
    convert_model(gguf, "hf", back)
    original, again = HfTokenizer(src), HfTokenizer(back)
    problems = []
    for text in family_texts(family):
        expected, got = original.ids(text), again.ids(text)
        if got != expected:
            problems.append(f"{text[:40]!r}: {_diff(got, expected)}")
    assert not problems, f"{family}: " + "; ".join(problems)
    config = json.loads((back / "tokenizer_config.json").read_text())
    style = STYLES[family]
    assert (config["bos_token"], config["eos_token"]) == (style.bos, style.eos)
    assert (back / "chat_template.jinja").read_text() == style.chat_template
    # and the folder converts to GGUF again, to a file that tokenizes the same
    ours = GgufTokenizer(_gguf(back, tmp_path / "again.gguf"))
    try:
        assert not _mismatches(family, ours, original)
    finally:
        ours.close()


def _variant(src: Path, dest: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(src, dest)
    spec = json.loads((dest / "tokenizer.json").read_text(encoding="utf-8"))
    edit(spec)
    (dest / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return dest


def test_gemma_split_on_space_after_the_normalizer_is_no_prefix(
    tiny_folders: Callable[[str], Path], tmp_path: Path
) -> None:
    """transformers 5's GemmaTokenizer writes a Split(" ") pre-tokenizer after the normalizer
    that already replaced every space: a no-op, and still no "▁" prefix in llama.cpp."""

    def edit(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"] = {
            "type": "Split",
            "pattern": {"String": " "},
            "behavior": "MergedWithPrevious",
            "invert": False,
        }

    src = _variant(tiny_folders("gemma3"), tmp_path / "src", edit)
    reference = HfTokenizer(src)
    ours = GgufTokenizer(_gguf(src, tmp_path / "g.gguf"))
    try:
        assert not _mismatches("gemma3", ours, reference)
    finally:
        ours.close()


def test_phi3_in_a_folder_of_any_name(tiny_folders: Callable[[str], Path], tmp_path: Path) -> None:
    """llama.cpp applies Phi-3's rstrip of its chat tokens only when general.name says
    "phi3": a Phi-3 fine-tune in a folder called anything else must still match."""
    src = tmp_path / "my-assistant"
    shutil.copytree(tiny_folders("phi3"), src)
    config = json.loads((src / "config.json").read_text())
    config["_name_or_path"] = "my-assistant"
    (src / "config.json").write_text(json.dumps(config))
    reference = HfTokenizer(src)
    ours = GgufTokenizer(_gguf(src, tmp_path / "m.gguf"))
    try:
        assert not _mismatches("phi3", ours, reference)
    finally:
        ours.close()


def test_a_non_phi3_model_named_phi3_is_not_stripped(
    tiny_folders: Callable[[str], Path], tmp_path: Path
) -> None:
    src = tmp_path / "phi3-style-mistral"
    shutil.copytree(tiny_folders("mistral"), src)
    reference = HfTokenizer(src)
    ours = GgufTokenizer(_gguf(src, tmp_path / "m.gguf"))
    try:
        assert not _mismatches("mistral", ours, reference)
    finally:
        ours.close()


@pytest.mark.parametrize("template", ["none", "eos", "bos+eos", "null"])
def test_bos_and_eos_as_the_post_processor_adds_them(
    tiny_folders: Callable[[str], Path], tmp_path: Path, template: str
) -> None:
    """tokenizer.json's post-processor decides what transformers adds (it drops
    tokenizer_config.json's add_bos_token / add_eos_token when tokenizer.json exists: the
    config here says the opposite and must be ignored); the GGUF adds the same."""

    def edit(spec: dict[str, Any]) -> None:
        bos, eos = (
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"SpecialToken": {"id": "</s>", "type_id": 0}},
        )
        seq = {"Sequence": {"id": "A", "type_id": 0}}
        single = {"none": [seq], "eos": [seq, eos], "bos+eos": [bos, seq, eos]}.get(template)
        if single is None:
            spec["post_processor"] = None
            return
        spec["post_processor"] = {
            "type": "TemplateProcessing",
            "single": single,
            "pair": [*single, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                t: {"id": t, "ids": [spec["model"]["vocab"][t]], "tokens": [t]}
                for t in ("<s>", "</s>")
            },
        }

    src = _variant(tiny_folders("mistral"), tmp_path / "src", edit)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update(add_bos_token=template in ("none", "eos", "null"), add_eos_token=False)
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    reference = HfTokenizer(src)
    assert (reference.ids("x")[0] == 1) == (template == "bos+eos")
    ours = GgufTokenizer(_gguf(src, tmp_path / "m.gguf"))
    try:
        assert not _mismatches("mistral", ours, reference)
    finally:
        ours.close()


def _metaspace(scheme: str) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": scheme,
            "split": False,
        }

    return edit


def test_metaspace_never_is_exact(tiny_folders: Callable[[str], Path], tmp_path: Path) -> None:
    src = _variant(tiny_folders("gemma3"), tmp_path / "src", _metaspace("never"))
    reference = HfTokenizer(src)
    ours = GgufTokenizer(_gguf(src, tmp_path / "g.gguf"))
    try:
        assert not _mismatches("gemma3", ours, reference)
    finally:
        ours.close()


@pytest.mark.parametrize("scheme", ["first", "always"])
def test_metaspace_with_a_prefix_warns_where_llama_cpp_differs(
    tiny_folders: Callable[[str], Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    scheme: str,
) -> None:
    """A Metaspace pre-tokenizer that prepends "▁" (the newer Llama-2-style layout) has no
    exact llama.cpp equivalent: llama.cpp adds the prefix before a leading space too (and,
    for "first", after every special token). The conversion says so; plain text still
    matches token for token."""
    src = _variant(tiny_folders("mistral"), tmp_path / "src", _metaspace(scheme))
    with caplog.at_level("WARNING", logger="edgekit"):
        gguf = _gguf(src, tmp_path / "m.gguf")
    assert any(
        "Metaspace" in r.getMessage() and "leading space" in r.getMessage() for r in caplog.records
    )
    reference = HfTokenizer(src)
    ours = GgufTokenizer(gguf)
    try:
        plain = BODY.replace("\n    ", "\n")
        assert ours.ids(plain) == reference.ids(plain)
    finally:
        ours.close()


def _unsupported(spec: dict[str, Any], what: str) -> None:
    if what == "lowercase":
        spec["normalizer"] = {"type": "Lowercase"}
    elif what == "nfkc-spm":
        spec["normalizer"] = {
            "type": "Sequence",
            "normalizers": [
                {"type": "NFKC"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        }
    elif what == "whitespace-split":
        spec["pre_tokenizer"] = {"type": "WhitespaceSplit"}
    elif what == "metaspace-star":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {
            "type": "Metaspace",
            "replacement": "*",
            "prepend_scheme": "always",
            "split": False,
        }


@pytest.mark.parametrize("what", ["lowercase", "nfkc-spm", "whitespace-split", "metaspace-star"])
def test_tokenizers_llama_cpp_cannot_express_are_refused(
    tiny_folders: Callable[[str], Path], tmp_path: Path, what: str
) -> None:
    from edgekit.errors import UnsupportedConversionError

    src = _variant(tiny_folders("gemma3"), tmp_path / "src", lambda s: _unsupported(s, what))
    with pytest.raises(UnsupportedConversionError, match="llama.cpp") as info:
        _gguf(src, tmp_path / "g.gguf")
    assert info.value.hint
    assert not list(tmp_path.glob("*.gguf")) and not list(tmp_path.glob(".*partial*"))


def _gguf_vocab(path: Path) -> Iterator[tuple[str, Any]]:
    from edgekit.gguf_header import read_gguf_header

    header = read_gguf_header(path, keep_arrays=True)
    for key in (
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
    ):
        yield key, header.get(key)


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        (
            "gemma3",
            {
                "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.add_space_prefix": False,
                "tokenizer.ggml.add_bos_token": True,
                "tokenizer.ggml.add_eos_token": False,
            },
        ),
        (
            "mistral",
            {
                "tokenizer.ggml.model": "llama",
                "tokenizer.ggml.add_space_prefix": True,
                "tokenizer.ggml.add_bos_token": True,
            },
        ),
        (
            "llama",
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "llama-bpe",
                "tokenizer.ggml.add_bos_token": True,
            },
        ),
        (
            "qwen3",
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "qwen2",
                "tokenizer.ggml.add_bos_token": False,
            },
        ),
    ],
)
def test_tokenizer_keys_llama_cpp_reads_are_written(
    tiny_folders: Callable[[str], Path], tmp_path: Path, family: str, expected: dict[str, Any]
) -> None:
    """Every key whose absence llama.cpp fills with a default is written explicitly."""
    got = dict(_gguf_vocab(_gguf(tiny_folders(family), tmp_path / "m.gguf")))
    for key, value in expected.items():
        assert got[key] == value, key


def test_eval_hint_when_tokenizations_differ() -> None:
    """The refusal says where the two differ and what to do about it, not to do what the
    user just did (compare the model with its own source)."""
    from edgekit.accuracy import evaluate
    from edgekit.errors import EvalError

    class Source:
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

        def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
            return self.ids

        def logits(self, tokens: list[int]) -> Any:
            raise AssertionError("never reached")

    with pytest.raises(EvalError, match="tokenize the text differently") as info:
        evaluate(Source([2, 10, 11, 12]), Source([2, 273, 10, 11, 12]), text="x", ctx=2)
    assert "token 1" in info.value.message and "4 vs 5 tokens" in info.value.message
    hint = info.value.hint or ""
    assert "edgekit convert" in hint and "its own source" not in hint


def test_a_llama_tokenizer_class_is_named_in_a_warning(
    tiny_folders: Callable[[str], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real Llama 2 folders name LlamaTokenizer, which transformers 5 rebuilds with
    Metaspace (prepend_scheme "first") for model_type llama: the GGUF follows the
    tokenizer.json, and the conversion says where AutoTokenizer differs from both. (For
    model_type mistral, transformers reads the tokenizer.json as it is: no warning.)"""
    from transformers import AutoTokenizer

    src = tmp_path / "src"
    shutil.copytree(tiny_folders("mistral"), src)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizerFast"
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="edgekit"):
        _gguf(src, tmp_path / "mistral.gguf")
    assert not any("LlamaTokenizer" in r.getMessage() for r in caplog.records)
    caplog.clear()
    model = json.loads((src / "config.json").read_text())
    model.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (src / "config.json").write_text(json.dumps(model))
    with caplog.at_level("WARNING", logger="edgekit"):
        gguf = _gguf(src, tmp_path / "m.gguf")
    assert any("LlamaTokenizer" in r.getMessage() for r in caplog.records)
    auto = AutoTokenizer.from_pretrained(src)
    ours = GgufTokenizer(gguf)
    try:
        assert ours.ids(BODY) == list(auto(BODY)["input_ids"])
        framed = f"<s>{BODY}"
        assert ours.ids(framed) != list(auto(framed)["input_ids"])  # the documented limit
        assert ours.ids(framed) == HfTokenizer(tiny_folders("mistral")).ids(framed)
    finally:
        ours.close()
