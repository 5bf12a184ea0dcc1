"""SFT-P: routed masks, the mask generator, compiled models, speed."""

from fedprune_app.core.registry import register_method

register_method("sftp")
