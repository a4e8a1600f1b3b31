"""A Hugging Face tokenizer.json as GGUF tokenizer metadata, and back: the one place that
decides how llama.cpp will tokenize.

A GGUF that loads can still tokenize differently from the Hugging Face tokenizer it came
from, and nothing fails: the model just sees other ids. So every key llama.cpp reads is
derived from what the tokenizer.json does, written explicitly (llama.cpp's defaults are
not the Hugging Face tokenizer's), and what llama.cpp cannot express is refused before a
byte is written, or, where only rare texts differ, said in a warning.

Two tokenizer styles, the two the supported families use:

- byte-level BPE (GPT-2 style; Llama 3, Qwen, SmolLM): ``tokenizer.ggml.model = "gpt2"``,
  merges, and a pre-tokenizer name. llama.cpp picks its split regex by that name, so the
  name is derived from the tokenizer.json's own pre-tokenizer, and an unknown one is
  refused. Normalizers: none, or NFC (Qwen), which llama.cpp does not apply (text that is
  already NFC, as nearly all text is, is unaffected).
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Phi-3, Gemma):
  ``tokenizer.ggml.model = "llama"``, token scores, byte tokens, and
  ``tokenizer.ggml.add_space_prefix``: llama.cpp prepends "▁" to the text and after every
  special token unless it is false. The Hugging Face pipelines and their llama.cpp value:
  ``Prepend("▁") + Replace(" ", "▁")`` (Llama 2, Mistral v0.1, Phi-3): true, exact;
  ``Replace(" ", "▁")`` alone, optionally followed by a ``Split(" ")`` that no longer finds
  a space (Gemma): false, exact; ``Metaspace`` with ``prepend_scheme`` never: false, exact;
  ``always``/``first``: true, with a warning (Metaspace adds no prefix before a leading
  space, ``first`` none after a special token; llama.cpp does). Anything else is refused.
  SentencePiece BPE merges by piece score; the scores are derived from the merge ranks
  (a piece scores minus the rank of the first merge that makes it), so llama.cpp merges
  in the order the Hugging Face BPE does.

Token types follow llama.cpp: added special tokens are CONTROL (chat templates parse them),
other added tokens USER_DEFINED (matched in text as Hugging Face matches added tokens),
the unknown token UNKNOWN when it is an added token, ``<0xNN>`` BYTE, padding slots up
to the model's vocabulary size UNUSED. llama.cpp ignores tokenizer.json's lstrip/rstrip
flags except through one rule keyed on ``general.name`` (Phi-3's: rstrip on its chat
tokens and ``</s>``); the writer names the file so that the rule applies exactly when the
tokenizer's flags are Phi-3's (``general_name``).

Modules: ``vocab`` (the GGUF vocabulary value and llama.cpp's constants), ``hf_json``
(reading tokenizer.json safely), ``spm`` (SentencePiece-style pipelines), ``byte_level``
(byte-level BPE pre-tokenizers, both ways), ``specials`` (special tokens, BOS/EOS, chat
template, strip flags), ``to_gguf`` (Hugging Face -> GGUF) and ``to_hf`` (GGUF -> Hugging
Face).
"""
