"""Drafter checkpoint -> mainline llama.cpp GGUF."""
