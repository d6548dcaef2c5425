"""The benchmark harness (outside the product package)."""
