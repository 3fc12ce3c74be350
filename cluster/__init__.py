"""twinflow."""
