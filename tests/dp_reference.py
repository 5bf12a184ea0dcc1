"""The reference the DP tests compare fedprune's ε with: Google's dp_accounting, called directly."""

from __future__ import annotations


def dp_accounting_epsilon(sigma: float, rounds: int, delta: float) -> float:
    """ε at δ of `rounds` Gaussian mechanisms of noise multiplier σ (no sampling), by
    dp_accounting's RDP accountant with its default orders."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(dp_event.GaussianDpEvent(sigma), rounds)
    return float(accountant.get_epsilon(delta))
