"""Prompting: a conversation (its tools, images and thoughts) as the prompt tokens a model reads, and its tool
calls read back."""
