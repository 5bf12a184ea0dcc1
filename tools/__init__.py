"""Tooling around the app: launch, deploy, grids, benchmarks, rescoring. Never imported by the app."""
