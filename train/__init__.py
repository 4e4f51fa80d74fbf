"""dflash-gguf train: a drafter for a GGUF target, distilled with llama.cpp as the teacher."""
