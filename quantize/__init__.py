"""Quantized variants of a drafter GGUF: recipes, llama-quantize, the check of what it wrote."""
