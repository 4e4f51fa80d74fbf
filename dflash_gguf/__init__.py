"""dflash-gguf: DFlash drafters from Hugging Face checkpoints to validated llama.cpp releases."""

__version__ = "0.1.0"
