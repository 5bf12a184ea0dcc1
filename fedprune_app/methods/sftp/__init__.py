"""SFT-P: the mask generator h_Θ and its gates, the objective, the schedules, the local round; the
routed bus it prunes is the shared `fedprune_app.structural` library."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.shapes import checkpoint_spec
from fedprune_app.structural.config import BusConfig

register_method(
    "sftp",
    config=(BusConfig, SFTPConfig),
    checkpoint_spec=checkpoint_spec,
    architectures=("llama", "mistral", "qwen2", "qwen3"),
)
