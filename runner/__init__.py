"""The pinned llama.cpp: fetch, patch, build, run llama-server, validate."""
