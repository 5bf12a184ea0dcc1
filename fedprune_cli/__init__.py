"""The `fedprune` command line: run, compare, rescore, grid, deploy, keys, bench."""
