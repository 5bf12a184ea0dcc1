"""SFT-P: routed masks, the mask generator, compiled models, speed."""

from fedprune_app.core.registry import register_method
from fedprune_app.methods.sftp.config import SFTPConfig

register_method("sftp", config=SFTPConfig)
