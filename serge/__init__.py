"""Serge: a self-hosted, private chat for local language models."""

__version__ = "0.1.0"
