"""The core: knows no method (protocol, strategy and client bases, config, registry, run
directory)."""
