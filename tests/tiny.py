"""A tiny LLaMA (random weights, the real SmolLM2 tokenizer) saved to disk: the test model."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from pathlib import Path

import torch

SMOLLM2_FIXTURE = Path(__file__).parent / "fixtures" / "smollm2"


def smollm2_files(out_dir: Path) -> Path:
    """SmolLM2's config and tokenizer (no weights) from the fixture the repository carries, unpacked
    into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in SMOLLM2_FIXTURE.iterdir():
        if f.suffix in (".json", ".jinja"):
            shutil.copyfile(f, out_dir / f.name)
    with gzip.open(SMOLLM2_FIXTURE / "tokenizer.json.gz", "rb") as src:
        (out_dir / "tokenizer.json").write_bytes(src.read())
    return out_dir


def tokenizer_dir() -> Path:
    """SmolLM2's tokenizer from the fixture (unpacked once per machine): no test needs the embedded
    model package."""
    from fedprune_app.llm.assets import build_once

    stamp = int((SMOLLM2_FIXTURE / "tokenizer.json.gz").stat().st_size)
    return build_once(
        Path(tempfile.gettempdir()) / f"fedprune-test-tokenizer-{stamp}", smollm2_files
    )


def save_tiny_llama(out_dir: Path, seed: int = 0, layers: int = 2) -> Path:
    """A 2-layer LlamaForCausalLM (hidden 64, GQA 4/2 heads) + tokenizer under `out_dir`."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
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
