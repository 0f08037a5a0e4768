"""Constrained decoding: JSON schemas checked and compiled into grammars over a model's tokens."""
