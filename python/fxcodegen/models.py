"""Tiny Hugging Face models built from a config in code (random weights, no download).

Used by ``python -m fxcodegen demo --model NAME``, the tests and the benches to try real
architectures. Needs ``transformers`` (imported when a model is built).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ARCHITECTURES", "CAUSAL_LM", "SDPA", "tiny_model"]

SDPA = "torch.nn.functional.scaled_dot_product_attention"
"""The splitting op that cuts these models at attention (``attn_implementation="sdpa"``)."""

# Small sizes shared by the decoder configs: 64 wide, 4 heads of 16, 2 key/value heads.
_DECODER = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}

ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    # name: (config class, model class, config arguments besides the layer count)
    "gpt2": (
        "GPT2Config",
        "GPT2Model",
        {"vocab_size": 128, "n_embd": 64, "n_head": 4, "n_positions": 512},
    ),
    "llama": ("LlamaConfig", "LlamaModel", _DECODER),
    "mistral": ("MistralConfig", "MistralModel", {**_DECODER, "sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2Model", _DECODER),
    "qwen3": ("Qwen3Config", "Qwen3Model", {**_DECODER, "head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaModel", {**_DECODER, "head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3Model", {**_DECODER, "pad_token_id": 0}),
    "opt": (
        "OPTConfig",
        "OPTModel",
        {
            "vocab_size": 128,
            "hidden_size": 64,
            "ffn_dim": 128,
            "num_attention_heads": 4,
            "word_embed_proj_dim": 64,
            "max_position_embeddings": 512,
            "pad_token_id": 1,
        },
    ),
    "bert": (
        "BertConfig",
        "BertModel",
        {
            "vocab_size": 128,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "max_position_embeddings": 512,
        },
    ),
}


# The same decoders with their language-model head, for ``generate``.
CAUSAL_LM = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "opt": "OPTForCausalLM",
}


def tiny_model(
    name: str, num_layers: int = 2, seed: int = 0, *, causal_lm: bool = False
) -> torch.nn.Module:
    """A tiny ``name`` model (see :data:`ARCHITECTURES`) in eval mode, attention through
    ``torch.nn.functional.scaled_dot_product_attention``, random weights from ``seed``.

    Call it as ``model(input_ids=ids)`` with ``ids`` of shape ``(batch, tokens)`` and values
    below 128; ``.last_hidden_state`` is the output. With ``causal_lm=True`` it is the
    decoder with its language-model head (:data:`CAUSAL_LM`): ``.logits`` is the output and
    ``model.generate(ids)`` works.
    """
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    if causal_lm and name not in CAUSAL_LM:
        raise ValueError(f"{name} has no causal-LM head here; choose one of {', '.join(CAUSAL_LM)}")
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - a dev dependency
        raise ImportError(f"building the {name} model needs transformers ({e})") from e
    config_cls, model_cls, kwargs = ARCHITECTURES[name]
    layers_key = "n_layer" if name == "gpt2" else "num_hidden_layers"
    config = getattr(transformers, config_cls)(**kwargs, **{layers_key: num_layers})
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, CAUSAL_LM[name] if causal_lm else model_cls)(config)
    return model.eval()
