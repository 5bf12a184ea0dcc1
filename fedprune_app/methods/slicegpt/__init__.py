"""SliceGPT: the residual stream rotated by its principal components and sliced; federated
covariance sums."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.slicegpt.config import SliceGPTConfig
from fedprune_app.methods.slicegpt.shapes import checkpoint_spec

register_method(
    "slicegpt",
    config=SliceGPTConfig,
    spec_from_checkpoint=checkpoint_spec,
    architectures=("llama", "mistral", "qwen2"),
)
