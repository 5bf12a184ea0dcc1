"""Tests of the structural-pruning library the methods share (`fedprune_app/structural/`)."""
