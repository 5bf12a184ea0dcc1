"""fedflap: FLAP-style importance over the routed bus coordinates, one global cut."""

from fedprune_app.core.registry import register_method

register_method("fedflap")
