"""One package per method: its math and its typed config."""
