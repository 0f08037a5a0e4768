"""llama.cpp's server suite run against Serge (see conftest.py)."""
