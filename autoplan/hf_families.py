"""Hugging Face parsers for Phi-3, Gemma-2, Gemma-3 (text) and GLM-4: Llama-shaped blocks with what each family
adds, following `transformers` configuration_phi3.py, configuration_gemma2.py, configuration_gemma3.py,
configuration_glm.py and configuration_glm4.py (defaults as there).

- Phi-3 fuses q/k/v (`qkv_proj`) and gate/up (`gate_up_proj`) into single matrices: the same shapes, so the same
  cost as separate ones. Its `sliding_window` applies to every layer; `partial_rotary_factor` (Phi-4-mini) sets the
  rotary fraction.
- Gemma-2/3: GeGLU (`hidden_activation` gelu_pytorch_tanh), an explicit `head_dim` (256) wider than hidden/heads,
  tied embeddings, a norm after attention and after the MLP (`sandwich_norm`), sliding-window attention on most
  layers (Gemma-2 every other layer, Gemma-3 five of six) priced as windowed attention; Gemma-2 soft-caps the final
  logits (`logit_softcapping`) and the attention scores (named in a note: an elementwise tanh inside attention);
  Gemma-3 adds q/k norms. A multimodal `gemma3` config is read through its `text_config`; the vision tower is not
  priced and a note says so.
- GLM-4 (`glm`: glm-4-9b-hf; `glm4`: GLM-4-0414): q/k/v biases, fused gate/up, rotary on half of each head
  (`partial_rotary_factor` 0.5); GLM-4-0414 adds the post-attention and post-MLP norms."""
from __future__ import annotations

from typing import Any, Callable, Dict

from autoplan.hf_fields import Config, count_sliding_layers, llama_like, sliding_window_all_layers, text_model


def _phi3(c: Config) -> Dict[str, Any]:
    fields = llama_like(c)
    return {
        **fields,
        **sliding_window_all_layers(c, fields["num_layers"]),
        "rotary_percent": c.fraction("partial_rotary_factor", 1.0),
        "hidden_dropout": c.num("resid_pdrop", 0.0),  # Phi3DecoderLayer resid_attn/mlp_dropout
    }


def _gemma(c: Config, slides: Callable[[int], bool]) -> Dict[str, Any]:
    """Fields shared by Gemma-2 and Gemma-3; `slides(i)` is the family's default sliding-layer rule."""
    fields = llama_like(c, activation_keys=("hidden_activation", "hidden_act"))
    window = c.int_opt("sliding_window", 0)
    num_sliding = count_sliding_layers(c, fields["num_layers"], slides) if window else 0
    softcap = c.get("attn_logit_softcapping", None)
    if softcap:
        c.notes.append(f"attn_logit_softcapping {softcap}: the tanh on attention scores is priced as plain "
                       f"attention")
    return {
        **fields,
        "tie_embeddings": bool(c.get("tie_word_embeddings", True)),  # Gemma ties by default
        "sandwich_norm": True,
        "logit_softcapping": c.num("final_logit_softcapping", 0.0),
        "sliding_window": window if num_sliding else 0,
        "num_sliding_window_layers": num_sliding,
    }


def _gemma2(c: Config) -> Dict[str, Any]:
    # configuration_gemma2.py: layer i slides when (i + 1) % 2 != 0, so layers 0, 2, 4, ...
    return _gemma(c, lambda i: (i + 1) % 2 != 0)


# configuration_gemma3.py Gemma3TextConfig defaults: the released multimodal configs state only the fields that
# differ (gemma-3-4b: hidden 2560, 34 layers, ...), so a missing field takes the class default as transformers does.
GEMMA3_TEXT_DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                            num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                            rope_theta=1000000.0, sliding_window=4096, sliding_window_pattern=6,
                            tie_word_embeddings=True)


def _gemma3_text(c: Config) -> Dict[str, Any]:
    c = c.derived(defaults=GEMMA3_TEXT_DEFAULTS)
    # configuration_gemma3.py: layer i slides when (i + 1) % sliding_window_pattern != 0 (default 6).
    pattern = c.int_opt("sliding_window_pattern", 6)
    return {**_gemma(c, lambda i: (i + 1) % pattern != 0), "qk_layernorm": True}


def _gemma3(c: Config) -> Dict[str, Any]:
    return text_model(c, "gemma3", "gemma3_text", _gemma3_text)


def _glm(c: Config) -> Dict[str, Any]:
    # modeling_glm.py GlmAttention: q/k/v carry attention_bias, o_proj never does; GlmMLP fuses gate and up.
    return {**llama_like(c), "rotary_percent": c.fraction("partial_rotary_factor", 0.5)}


def _glm4(c: Config) -> Dict[str, Any]:
    # modeling_glm4.py Glm4DecoderLayer: post_self_attn_layernorm and post_mlp_layernorm besides the two pre-norms.
    return {**_glm(c), "sandwich_norm": True}


FAMILIES: Dict[str, Callable[[Config], Dict[str, Any]]] = {
    "phi3": _phi3,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3,
    "glm": _glm,
    "glm4": _glm4,
}
