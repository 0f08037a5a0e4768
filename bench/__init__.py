"""Serge's benchmark suite: `python -m bench --help` (see bench/README.md)."""
