"""Per-method tests; each method package also holds its conformance settings."""
