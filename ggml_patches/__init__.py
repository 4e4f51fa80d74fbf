"""The llama.cpp patch series (`series` + `NNNN-name.patch`), shipped as package data."""
