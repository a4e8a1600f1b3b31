"""Tiny random causal LMs of every supported family, built in-process in seconds.

Each model gets a tokenizer trained with ``tokenizers`` on local text (the shipped Austen
excerpt plus a few multilingual lines), built with the STRUCTURE of its family's real
``tokenizer.json``: the same normalizer, pre-tokenizer, post-processor, decoder, model
switches (byte fallback, ``ignore_merges``, unknown token), added and special tokens with
their flags, and where the real files put them. Only the vocabulary is small and learned
here. The structures, as the real checkpoints ship them:

- Llama 3 (Meta-Llama-3/3.1/3.2): byte-level BPE, no normalizer, the tiktoken-style
  ``Split`` regex (digits in runs of up to 3) then ``ByteLevel(use_regex=false)``,
  ``ignore_merges: true``, ``<|begin_of_text|>`` added by a TemplateProcessing inside a
  post-processor Sequence, chat tokens ``<|start_header_id|>`` ... ``<|eot_id|>`` at the end.
- Mistral 7B v0.1 (and Llama 2, the same file): SentencePiece-style BPE with byte fallback,
  the normalizer ``Prepend("▁")`` + ``Replace(" ", "▁")`` and no pre-tokenizer (the legacy
  layout those checkpoints ship; a newer ``Metaspace`` layout is covered by its own test),
  ``<unk>``/``<s>``/``</s>`` at 0-2, ``<0x00>``-``<0xFF>`` at 3-258, whitespace-run pieces
  first, single characters last, and the merges SentencePiece's extractor writes (every
  split of a piece into two pieces, ranked by the piece's score).
- Qwen2.5 / Qwen3: byte-level BPE, an NFC normalizer, Qwen's ``Split`` regex (single
  digits), ``ByteLevel`` post-processor and decoder, no BOS, ``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>`` special and ``<tool_call>`` (+ ``<think>`` in Qwen3)
  added but not special.
- Phi-3 (mini 4k): the Llama 2 file plus its chat tokens after the vocabulary, ``rstrip``
  on the chat tokens and on ``</s>`` (which is not special), and a config vocabulary
  larger than the tokenizer's (padding slots).
- Gemma 3: SentencePiece-style BPE with byte fallback, the normalizer ``Replace(" ", "▁")``
  with NO ``Prepend`` and no pre-tokenizer, ``<pad>``/``<eos>``/``<bos>``/``<unk>``/
  ``<mask>`` at 0-4, ``<start_of_turn>``/``<end_of_turn>``, whitespace user-defined pieces
  (``\\n``, ``\\t`` runs) added but not special, then the byte tokens.

Weights are random but drawn at std 1/sqrt(hidden): logits of order one with clear top-1
margins, and a network that neither explodes nor collapses, so parity tests can demand
argmax equality at every position.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_CHAT = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL_CHAT = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }}"
    " [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
PHI3_CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"
)
GEMMA3_CHAT = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# A few lines in other scripts, so the tokenizers learn merges of multi-byte characters too.
MULTILINGUAL_LINES = (
    "Café, naïve, façade, déjà vu, Ångström, Straße, señor, coöperate, São Paulo, Kraków.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο· καλημέρα, κόσμε.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
    "我们在东京见面，然后去北京。日本語のテキストと한국어 문장도 있습니다。",
    "Numbers: 1234567, 2026-04-01, 3.14159 and 1,000,000; emoji 🙂 👍🏽 🚀.",
)


@dataclass(frozen=True, kw_only=True)
class Added:
    """An entry of tokenizer.json's ``added_tokens``, with the flags the real files set."""

    content: str
    special: bool = True
    rstrip: bool = False
    lstrip: bool = False
    normalized: bool = False


@dataclass(frozen=True, kw_only=True)
class TokenizerStyle:
    kind: str  # "byte-level" or "sentencepiece"
    bos: str | None
    eos: str
    pad: str | None
    unk: str | None = None
    add_bos: bool = False
    chat_template: str = CHATML
    # byte-level
    split: str = ""
    normalizer_nfc: bool = False
    ignore_merges: bool = False
    llama3_post: bool = False  # ByteLevel + TemplateProcessing in a Sequence (Llama 3)
    # sentencepiece: tokens before the byte tokens, after them (user-defined pieces), and
    # after the learned vocabulary; whether the normalizer prepends "▁"
    head: tuple[Added, ...] = ()
    after_bytes: tuple[Added, ...] = ()
    tail: tuple[Added, ...] = ()
    prepend: bool = True
    tokenizer_size: int | None = None  # below the model's vocabulary: padding slots


_SPM_SPECIALS = (Added(content="<unk>"), Added(content="<s>"), Added(content="</s>"))
_PHI3_TAIL = (
    Added(content="<|endoftext|>"),
    Added(content="<|assistant|>", rstrip=True),
    *(Added(content=f"<|placeholder{i}|>", rstrip=True) for i in range(1, 5)),
    Added(content="<|system|>", rstrip=True),
    Added(content="<|end|>", rstrip=True),
    *(Added(content=f"<|placeholder{i}|>", rstrip=True) for i in range(5, 7)),
    Added(content="<|user|>", rstrip=True),
)

STYLES: dict[str, TokenizerStyle] = {
    "llama": TokenizerStyle(
        kind="byte-level",
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad=None,
        add_bos=True,
        chat_template=LLAMA3_CHAT,
        split=LLAMA3_SPLIT,
        ignore_merges=True,
        llama3_post=True,
        tail=tuple(
            Added(content=c)
            for c in (
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>",
                "<|finetune_right_pad_id|>",
                "<|reserved_special_token_2|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eom_id|>",
                "<|eot_id|>",
                "<|python_tag|>",
            )
        ),
    ),
    "mistral": TokenizerStyle(
        kind="sentencepiece",
        bos="<s>",
        eos="</s>",
        pad=None,
        unk="<unk>",
        add_bos=True,
        chat_template=MISTRAL_CHAT,
        head=_SPM_SPECIALS,
    ),
    "qwen2": TokenizerStyle(
        kind="byte-level",
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        split=QWEN2_SPLIT,
        normalizer_nfc=True,
        tail=(
            Added(content="<|endoftext|>"),
            Added(content="<|im_start|>"),
            Added(content="<|im_end|>"),
            Added(content="<|object_ref_start|>"),
            Added(content="<|object_ref_end|>"),
            Added(content="<|fim_prefix|>"),
            Added(content="<|fim_middle|>"),
            Added(content="<|fim_suffix|>"),
            Added(content="<tool_call>", special=False),
            Added(content="</tool_call>", special=False),
        ),
    ),
    "qwen3": TokenizerStyle(
        kind="byte-level",
        bos=None,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        split=QWEN2_SPLIT,
        normalizer_nfc=True,
        tail=(
            Added(content="<|endoftext|>"),
            Added(content="<|im_start|>"),
            Added(content="<|im_end|>"),
            Added(content="<|fim_prefix|>"),
            Added(content="<|fim_middle|>"),
            Added(content="<|fim_suffix|>"),
            Added(content="<tool_call>", special=False),
            Added(content="</tool_call>", special=False),
            Added(content="<think>", special=False),
            Added(content="</think>", special=False),
        ),
    ),
    "phi3": TokenizerStyle(
        kind="sentencepiece",
        bos="<s>",
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        unk="<unk>",
        add_bos=True,
        chat_template=PHI3_CHAT,
        # Phi-3's </s> strips the whitespace after it and is not special.
        head=(
            Added(content="<unk>"),
            Added(content="<s>"),
            Added(content="</s>", special=False, rstrip=True),
        ),
        tail=_PHI3_TAIL,
        tokenizer_size=500,
    ),
    "gemma3": TokenizerStyle(
        kind="sentencepiece",
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        unk="<unk>",
        add_bos=True,
        chat_template=GEMMA3_CHAT,
        prepend=False,
        head=(
            Added(content="<pad>"),
            Added(content="<eos>"),
            Added(content="<bos>"),
            Added(content="<unk>"),
            Added(content="<mask>"),
            Added(content="[multimodal]"),
            *(Added(content=f"<unused{i}>") for i in range(4)),
            Added(content="<start_of_turn>"),
            Added(content="<end_of_turn>"),
        ),
        after_bytes=tuple(
            Added(content=c, special=False) for c in ("\n", "\n\n", "\n\n\n", "\t", "\t\t")
        ),
    ),
}

# family -> (tokenizer style, add BOS, transformers config overrides)
FAMILIES: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "llama": ("byte-level", True, {}),
    "mistral": ("sentencepiece", True, {"sliding_window": None}),
    "qwen2": ("byte-level", False, {"tie_word_embeddings": True}),
    "qwen3": ("byte-level", False, {"head_dim": 32}),
    "phi3": ("sentencepiece", True, {"sliding_window": None}),
    "gemma3": (
        "sentencepiece",
        True,
        {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 512, "rope_theta": 10000.0},
    ),
}


def training_text() -> str:
    return (
        resources.files("edgekit")
        .joinpath("data/pride-and-prejudice-opening.txt")
        .read_text(encoding="utf-8")
    )


def _training_lines() -> list[str]:
    lines = [line for line in training_text().splitlines() if line.strip()]
    return lines + list(MULTILINGUAL_LINES) * 30


def _added_json(token: Added, token_id: int) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": token.content,
        "single_word": False,
        "lstrip": token.lstrip,
        "rstrip": token.rstrip,
        "normalized": token.normalized,
        "special": token.special,
    }


def _template(bos: str | None, bos_id: int | None) -> dict[str, Any]:
    if bos is None or bos_id is None:
        return {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {},
        }
    return {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _byte_level_json(style: TokenizerStyle, vocab_size: int) -> dict[str, Any]:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(style.split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    learner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(style.tail),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    learner.train_from_iterator(_training_lines(), trainer=trainer)
    spec: dict[str, Any] = json.loads(learner.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = []
    for token in style.tail:
        vocab[token.content] = len(vocab)
        added.append(_added_json(token, vocab[token.content]))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    bos_id = vocab.get(style.bos) if style.bos else None
    post: dict[str, Any]
    if style.llama3_post:
        post = {
            "type": "Sequence",
            "processors": [
                {
                    "type": "ByteLevel",
                    "add_prefix_space": True,
                    "trim_offsets": False,
                    "use_regex": True,
                },
                _template(style.bos, bos_id),
            ],
        }
        decoder = {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        }
    else:
        post = {**byte_level, "use_regex": False}
        decoder = {**byte_level, "use_regex": False}
    spec.update(
        added_tokens=added,
        normalizer={"type": "NFC"} if style.normalizer_nfc else None,
        pre_tokenizer={
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": style.split},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        },
        post_processor=post,
        decoder=decoder,
    )
    spec["model"].update(
        dropout=None,
        unk_token=None,
        continuing_subword_prefix=None,
        end_of_word_suffix=None,
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=style.ignore_merges,
    )
    return spec


def sentencepiece_merges(vocab: dict[str, int]) -> list[list[str]]:
    """The merges SentencePiece's BPE extractor writes for ``vocab``: every split of every
    piece into two pieces of the vocabulary, ranked by the piece's id (its score order),
    then by the ids of the two halves."""
    merges: list[tuple[int, int, int, str, str]] = []
    for piece, piece_id in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((piece_id, vocab[left], vocab[right], left, right))
    merges.sort()
    return [[left, right] for _, _, _, left, right in merges]


def _sentencepiece_json(style: TokenizerStyle, vocab_size: int) -> dict[str, Any]:
    """A SentencePiece BPE model as transformers' converter writes it to tokenizer.json:
    the pieces are learned with ``tokenizers`` (within words, as SentencePiece splits by
    whitespace), then laid out in SentencePiece's order."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    size = style.tokenizer_size or vocab_size
    fixed = [*style.head, *style.after_bytes, *style.tail]
    runs = ["▁▁", "▁▁▁▁"]  # SentencePiece's whitespace-run pieces come first (Llama 2: 259)
    learner = Tokenizer(models.BPE())
    steps = [normalizers.Replace(" ", "▁")]
    learner.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), *steps] if style.prepend else steps
    )
    learner.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(
        vocab_size=size - len(fixed) - 256 - len(runs), show_progress=False
    )
    learner.train_from_iterator(_training_lines(), trainer=trainer)
    learned: dict[str, int] = json.loads(learner.to_str())["model"]["vocab"]
    by_rank = sorted(learned, key=learned.__getitem__)
    pieces = [p for p in by_rank if len(p) > 1]
    chars = [p for p in by_rank if len(p) == 1]

    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []

    def put(token: str, added_token: Added | None = None) -> None:
        if token in vocab:
            return
        vocab[token] = len(vocab)
        if added_token is not None:
            added.append(_added_json(added_token, vocab[token]))

    for token in style.head:
        put(token.content, token)
    for b in range(256):
        put(f"<0x{b:02X}>")
    for token in style.after_bytes:
        put(token.content, token)
    for piece in [*runs, *pieces, *chars]:  # merged pieces by score, single characters last
        if len(vocab) < size - len(style.tail):
            put(piece)
    for token in style.tail:
        put(token.content, token)

    steps_json = [{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]
    decoders = [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if style.prepend:
        steps_json = [{"type": "Prepend", "prepend": "▁"}, *steps_json]
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    normal = {tok: i for tok, i in vocab.items() if i not in {a["id"] for a in added}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": (
            {"type": "Sequence", "normalizers": steps_json} if style.prepend else steps_json[0]
        ),
        "pre_tokenizer": None,
        "post_processor": _template(
            style.bos if style.add_bos else None, vocab.get(style.bos or "")
        ),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": style.unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": sentencepiece_merges(normal),
        },
    }


def tokenizer_json(family: str, vocab_size: int) -> dict[str, Any]:
    """The tokenizer.json of ``family``'s tiny tokenizer."""
    style = STYLES[family]
    if style.kind == "byte-level":
        return _byte_level_json(style, vocab_size)
    return _sentencepiece_json(style, vocab_size)


def build_tokenizer(family: str, vocab_size: int) -> Any:
    """``family``'s tiny tokenizer as a transformers tokenizer (TokenizersBackend: it keeps
    tokenizer.json's pipeline as it is, like the folder it is saved to)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    style = STYLES[family]
    tok = Tokenizer.from_str(json.dumps(tokenizer_json(family, vocab_size)))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=style.bos,
        eos_token=style.eos,
        unk_token=style.unk,
        pad_token=style.pad or style.eos,
    )
    fast.chat_template = style.chat_template
    return fast


def _config(family: str, vocab_size: int, hidden: int, tokenizer: Any, layers: int = 2) -> Any:
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    classes = {
        "llama": LlamaConfig,
        "mistral": MistralConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "phi3": Phi3Config,
        "gemma3": Gemma3TextConfig,
    }
    _, _, overrides = FAMILIES[family]
    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "initializer_range": 1.0 / hidden**0.5,
    }
    return classes[family](**{**common, **overrides})


def build_tiny_model(
    family: str,
    out: Path,
    *,
    hidden: int = 64,
    vocab_size: int = 512,
    seed: int = 0,
    layers: int = 2,
) -> Path:
    """Write a tiny random model of ``family`` (safetensors, fp32) with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer(family, vocab_size)
    config = _config(family, vocab_size, hidden, tokenizer, layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms near their neutral value, biases small
                p.copy_(
                    torch.randn_like(p) * 0.1
                    + (0.0 if "bias" in name or family == "gemma3" else 1.0)
                )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
