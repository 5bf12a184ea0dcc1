"""A tiny LLaMA (random weights, the real SmolLM2 tokenizer) saved to disk: the test model."""

from __future__ import annotations

from pathlib import Path

import torch


def save_tiny_llama(out_dir: Path, seed: int = 0, layers: int = 2) -> Path:
    """A 2-layer LlamaForCausalLM (hidden 64, GQA 4/2 heads) + tokenizer under `out_dir`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from fedprune_app.llm.assets import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
