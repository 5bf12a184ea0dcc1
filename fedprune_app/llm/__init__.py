"""The LLM library: models, LoRA, data, training, evaluation, assets. No Flower import."""
