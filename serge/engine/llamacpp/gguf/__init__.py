"""GGUF files made or rewritten before llama.cpp loads them: the bundled embedder converted without torch, a model re-quantized."""
