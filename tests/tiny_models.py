"""Tiny random causal LMs of every supported family, built in-process in seconds.

Each model gets a real tokenizer trained with ``tokenizers`` on the shipped Austen text:
byte-level BPE (GPT-2 style, as Llama 3, Qwen and SmolLM use) or SentencePiece-style BPE
with byte fallback (as Llama 2, Mistral, Phi-3 and Gemma use). Weights are random but
drawn at std 1/sqrt(hidden): logits of order one with clear top-1 margins, and a network
that neither explodes nor collapses, so parity tests can
demand argmax equality at every position.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# family -> (tokenizer style, add BOS, transformers config overrides)
FAMILIES: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "llama": ("byte-level", True, {}),
    "mistral": ("sentencepiece", True, {"sliding_window": None}),
    "qwen2": ("byte-level", False, {"tie_word_embeddings": True}),
    "qwen3": ("byte-level", False, {"head_dim": 32}),
    "phi3": ("sentencepiece", True, {"sliding_window": None, "pad_token_id": 0}),
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


def _byte_level_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([training_text()], trainer=trainer)
    return tok


def _sentencepiece_tokenizer(vocab_size: int, *, rstrip_chat_tokens: bool = False) -> Any:
    """Llama-2-style BPE: '▁' for spaces, byte fallback tokens <0x00>..<0xFF> after the
    specials, merges learned on the text. Built as tokenizer.json the way HF writes it."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    learner.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    n_fixed = 3 + 256 + 3
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_fixed, show_progress=False)
    learner.train_from_iterator([training_text()], trainer=trainer)
    learned = json.loads(learner.to_str())["model"]

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    # <|endoftext|> as in Phi-3: llama.cpp's phi3 vocabulary loader requires it.
    vocab.update({"<|im_start|>": 259, "<|im_end|>": 260, "<|endoftext|>": 261})
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": rstrip_chat_tokens and i >= 259,
                "normalized": False,
                "special": True,
            }
            for c, i in [
                ("<unk>", 0),
                ("<s>", 1),
                ("</s>", 2),
                ("<|im_start|>", 259),
                ("<|im_end|>", 260),
                ("<|endoftext|>", 261),
            ]
        ],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": learned["merges"],
        },
    }
    return Tokenizer.from_str(json.dumps(spec))


def build_tokenizer(style: str, add_bos: bool, vocab_size: int, *, family: str = "") -> Any:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if style == "byte-level":
        tok = _byte_level_tokenizer(vocab_size)
        bos, eos, unk = "<|endoftext|>", "<|im_end|>", None
    else:
        # Phi-3's chat tokens strip the whitespace after them (rstrip in its tokenizer.json),
        # and llama.cpp's phi3 vocabulary does the same.
        tok = _sentencepiece_tokenizer(vocab_size, rstrip_chat_tokens=family == "phi3")
        bos, eos, unk = "<s>", "</s>", "<unk>"
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=eos
    )
    fast.chat_template = CHATML
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

    style, add_bos, _ = FAMILIES[family]
    tokenizer = build_tokenizer(style, add_bos, vocab_size, family=family)
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
