"""The vocabulary a Megatron-LM launch trains with, from its tokenizer arguments, and Megatron's padding of it.

Megatron builds the tokenizer named by --tokenizer-type (megatron/core/tokenizers/utils/build_tokenizer.py) and
pads its size to a multiple of --make-vocab-size-divisible-by x tp (vocab_size_with_padding there), unless
--padded-vocab-size gives the embedding rows outright (megatron/training/argument_utils.py: should_pad_vocab False).
Only tokenizers whose size is fixed by their name are known here; any other asks for --set vocab_size=N."""
from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Dict, List, Optional, Tuple

from autoplan.errors import InputError
from autoplan.integrations.megatron_flags import pos_int, typed

# Megatron's own tokenizers with a fixed vocabulary:
# - GPT2BPETokenizer: the GPT-2 BPE files gpt2-vocab.json / gpt2-merges.txt, 50257 tokens (tests/data/hf_configs/
#   gpt2.json vocab_size);
# - Llama2Tokenizer: the Llama-2 SentencePiece model, 32000 pieces;
# - Llama3Tokenizer (Megatron-LM before the megatron/core/tokenizers move, megatron/training/tokenizer/tokenizer.py
#   _Llama3Tokenizer): the Llama-3 tiktoken ranks, 128000, plus 256 reserved special tokens = 128256 (tests/data/
#   hf_configs/llama3_8b.json vocab_size);
# - TikTokenizer: its vocab_size argument, --vocab-size or DEFAULT_TIKTOKEN_MAX_VOCAB = 2**17
#   (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py), whatever the ranks file holds.
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000, "Llama3Tokenizer": 128256,
                   "TikTokenizer": 2 ** 17}

# Hugging Face tokenizers (--tokenizer-type HuggingFaceTokenizer --tokenizer-model ORG/NAME, a local copy whose
# folder keeps NAME, or a mirror such as unsloth/NAME), by the start of NAME in lower case; the longest match wins.
# The size is the model's config.json vocab_size on the Hugging Face Hub: the embedding rows of the released
# checkpoint, which is len(tokenizer) or above it (Qwen2.5: 151665 tokens in 152064 rows), so memory is never
# under-counted. The entries with a fixture in tests/data/hf_configs are checked against it
# (tests/unit/test_megatron_fragments.py); Megatron-LM's own example fragments state the same sizes
# (examples/post_training/modelopt/conf: --padded-vocab-size 152064 for Qwen2.5-7B, 202048 for Llama-4, 201088 for
# gpt-oss, 163840 for Kimi-K2; DeepSeek-R1's --make-vocab-size-divisible-by 1280 pads 129280 to itself).
HF_TOKENIZER_VOCAB: Dict[str, Tuple[str, int]] = {
    "llama-2-": ("meta-llama, NousResearch", 32000),
    "meta-llama-3": ("meta-llama, NousResearch", 128256),
    "llama-3": ("meta-llama (3, 3.1, 3.2, 3.3)", 128256),
    "llama-4-": ("meta-llama", 202048),
    "qwen2.5-0.5b": ("Qwen", 151936), "qwen2.5-1.5b": ("Qwen", 151936), "qwen2.5-3b": ("Qwen", 151936),
    "qwen2.5-": ("Qwen (7B and larger, Math-7B)", 152064),
    "qwen3-": ("Qwen (dense and MoE)", 151936),
    "deepseek-v3": ("deepseek-ai", 129280), "deepseek-r1": ("deepseek-ai", 129280),
    "deepseek-r1-distill-qwen-1.5b": ("deepseek-ai", 151936), "deepseek-r1-distill-qwen-": ("deepseek-ai", 152064),
    "deepseek-r1-distill-llama-": ("deepseek-ai", 128256),
    "deepseek-v2": ("deepseek-ai (V2, V2-Lite)", 102400),
    "mistral-7b-v0.1": ("mistralai", 32000), "mistral-7b-instruct-v0.1": ("mistralai", 32000),
    "mistral-7b-instruct-v0.2": ("mistralai", 32000), "mistral-7b-v0.3": ("mistralai", 32768),
    "mistral-7b-instruct-v0.3": ("mistralai", 32768), "mixtral-8x7b": ("mistralai", 32000),
    "mixtral-8x22b": ("mistralai", 32768), "mistral-nemo": ("mistralai", 131072),
    "kimi-k2": ("moonshotai", 163840),
    "gpt-oss": ("openai", 201088),
    "nemotron-h-": ("nvidia", 131072), "nvidia-nemotron-nano-9b-v2": ("nvidia", 131072),
    "nvidia-nemotron-3-": ("nvidia", 131072), "nemotron-mini-4b": ("nvidia", 256000),
}


def hf_tokenizer_vocab(model: str) -> Optional[int]:
    """Embedding rows of the Hugging Face model a --tokenizer-model names, or None when it is not a known one."""
    name = PurePosixPath(model.rstrip("/")).name.lower()
    matches = [prefix for prefix in HF_TOKENIZER_VOCAB if name.startswith(prefix)]
    return HF_TOKENIZER_VOCAB[max(matches, key=len)][1] if matches else None


def _tokenizer_vocab(f: Dict[str, Optional[str]]) -> Tuple[Optional[int], str]:
    """(vocabulary of the tokenizer before padding, where it came from) or (None, why it is unknown)."""
    kind = f.get("tokenizer-type")
    vocab_file = (f.get("vocab-file") or "")
    if kind in (None, "GPT2BPETokenizer") and f.get("merge-file") and vocab_file:
        # A vocab file with BPE merges: the GPT-2 BPE files (gpt2-vocab.json, gpt2-merges.txt), Megatron's default
        # GPT tokenizer in the examples that name no type.
        return TOKENIZER_VOCAB["GPT2BPETokenizer"], f"--vocab-file {PurePosixPath(vocab_file).name} with " \
                                                   f"--merge-file (GPT2BPETokenizer)"
    if kind in TOKENIZER_VOCAB:
        return TOKENIZER_VOCAB[kind], f"--tokenizer-type {kind}"
    model = f.get("tokenizer-model") or ""
    # HuggingFaceTokenizer, or a wrapper of the same Hub tokenizer under another type name (ROCm Megatron-LM's
    # DeepSeekV3Tokenizer with --tokenizer-model deepseek-ai/DeepSeek-V3).
    if model and hf_tokenizer_vocab(model):
        return hf_tokenizer_vocab(model), f"--tokenizer-model {model} (its config.json vocab_size)"
    if kind is None:
        return None, "the arguments (no --vocab-size, no --tokenizer-type)"
    return None, f"--tokenizer-type {kind}" + (f" --tokenizer-model {model}" if model else " without --tokenizer-model")


def padded_vocab(vocab: int, f: Dict[str, Optional[str]], tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by (default 128) x tp
    [megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding]."""
    multiple = typed(f, "make-vocab-size-divisible-by", pos_int, 128) * tp
    return int(math.ceil(vocab / multiple) * multiple)


def vocab_size(f: Dict[str, Optional[str]], tp: int, override: Optional[int], notes: List[str]) -> int:
    """The embedding rows the run allocates: --padded-vocab-size as given, else --vocab-size or the tokenizer's
    size, padded as Megatron does."""
    if override is not None:
        return override
    rows = typed(f, "padded-vocab-size", pos_int)
    if rows is not None:
        notes.append(f"vocab {rows} rows from --padded-vocab-size (Megatron does not pad it)")
        return rows
    given = typed(f, "vocab-size", pos_int)
    source = "--vocab-size"
    if given is None:
        given, source = _tokenizer_vocab(f)
        if given is None:
            raise InputError(f"cannot tell the vocabulary size from {source}; pass "
                             f"--set vocab_size=N (the tokenizer's size)")
    padded = padded_vocab(given, f, tp)
    if source != "--vocab-size":
        notes.append(f"vocab {given} from {source}")
    if padded != given:
        notes.append(f"vocab {given} padded to {padded} rows as Megatron does (make-vocab-size-divisible-by x tp)")
    return padded
