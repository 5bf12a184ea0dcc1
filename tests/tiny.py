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


ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "opt")


def save_tiny(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """A 2-layer causal LM of transformers' `arch` (hidden 64, 4 heads, 2 kv heads where the
    architecture has them; Qwen2's q/k/v biases and Qwen3's q/k norms as the classes build them),
    random weights, + the tiny tokenizer, under `out_dir`."""
    import transformers as tf

    if arch == "llama":
        return save_tiny_llama(out_dir, seed)
    tok = tf.AutoTokenizer.from_pretrained(tokenizer_dir())
    common = {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    decoder = {"intermediate_size": 128, "num_key_value_heads": 2, "tie_word_embeddings": True}
    configs = {
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, decoder),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, decoder),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {**decoder, "head_dim": 16}),
        "opt": (tf.OPTConfig, tf.OPTForCausalLM, {"ffn_dim": 128, "word_embed_proj_dim": 64}),
    }
    config_class, model_class, extra = configs[arch]
    torch.manual_seed(seed)
    model = model_class(config_class(**common, **extra))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def perturb(model: torch.nn.Module, weights: float = 1.0, biases: float = 0.0) -> torch.nn.Module:
    """A random model made a sharper test subject, in place: norm weights scaled by U(1, 1.5) (so
    folding them matters), matrices by `weights`, other 1-D parameters shifted by N(0, biases²) (so
    a dropped bias changes the logits); one seeded generator."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.5 * torch.rand(p.shape, generator=gen))
            elif p.dim() == 1 and biases:
                p.add_(biases * torch.randn(p.shape, generator=gen))
            elif p.dim() > 1 and weights != 1.0:
                p.mul_(weights)
    return model
