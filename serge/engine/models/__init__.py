"""The model library: what is installed, where models come from (hub, PyPI, this machine), their facts, pulls."""
