"""FedTPA: rank pruning (client) and ITPA / LCWA / DAPR (server)."""

from fedprune_app.core.registry import register_method

register_method("fedtpa")
