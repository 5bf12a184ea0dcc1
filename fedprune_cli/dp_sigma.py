"""The noise multiplier σ for a target ε: what to set as `dp-noise-multiplier`.

    fedprune dp-sigma --epsilon 8 --delta 1e-5 --rounds 3
    fedprune dp-sigma --epsilon 8 --delta 1e-5 --rounds 3 --clipping-norm 0.1 --sampled 4

ε is accounted as a run reports it: Flower's RDP accountant (dp-accounting), one Gaussian mechanism
per released round, no amplification by sampling, add-or-remove-one client. The σ printed is the
smallest (to 0.1%) whose `--rounds` releases stay within ε at δ; keep δ below 1/(number of clients).
"""

from __future__ import annotations

import argparse
import math
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epsilon", type=float, required=True, help="target ε (> 0)")
    parser.add_argument("--delta", type=float, required=True, help="δ in (0, 1), below 1/N")
    parser.add_argument("--rounds", type=int, required=True, help="released rounds (>= 1)")
    parser.add_argument(
        "--clipping-norm", type=float, help="C, to print the noise std σ·C/m (with --sampled)"
    )
    parser.add_argument("--sampled", type=int, help="m, the clients sampled per round")


def problem(args: argparse.Namespace) -> str | None:
    """One line naming the first bad option, or None."""
    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        return f"--epsilon must be a finite float > 0, got {args.epsilon!r}"
    if not 0.0 < args.delta < 1.0:
        return f"--delta must be a float in (0, 1), got {args.delta!r}"
    if args.rounds < 1:
        return f"--rounds must be an int >= 1, got {args.rounds!r}"
    if (args.clipping_norm is None) != (args.sampled is None):
        return "--clipping-norm and --sampled go together (the noise std is σ·C/m)"
    if args.clipping_norm is not None and not args.clipping_norm > 0:
        return f"--clipping-norm must be a float > 0, got {args.clipping_norm!r}"
    if args.sampled is not None and args.sampled < 1:
        return f"--sampled must be an int >= 1, got {args.sampled!r}"
    return None


def run(args: argparse.Namespace) -> int:
    """Print the `dp-noise-multiplier` line (and the noise std); 2 on a bad option."""
    if (line := problem(args)) is not None:
        print(f"fedprune dp-sigma: error: {line}", file=sys.stderr)
        return 2
    from fedprune_app.core.privacy import epsilon_after, noise_multiplier_for

    try:
        sigma = noise_multiplier_for(args.epsilon, args.rounds, args.delta)
    except ValueError as err:
        print(f"fedprune dp-sigma: error: {err}", file=sys.stderr)
        return 2
    sigma = math.ceil(sigma * 1e4) / 1e4  # 4 decimals, rounded up: still within ε
    eps = epsilon_after(sigma, args.rounds, args.delta)
    print(
        f"dp-noise-multiplier = {sigma:g}   # ε = {eps:.3f} at δ = {args.delta:g} after "
        f"{args.rounds} round(s) (Flower's RDP accountant, no amplification by sampling)"
    )
    if args.clipping_norm is not None:
        std = sigma * args.clipping_norm / args.sampled
        print(
            f"# noise std σ·C/m = {std:.4g} per entry of the mean update (C = "
            f"{args.clipping_norm:g}, m = {args.sampled}); the mean update's norm is at most C"
        )
    return 0
