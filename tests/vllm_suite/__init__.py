"""vLLM's OpenAI-server test cases, rewritten against a real Serge (see conftest.py)."""
