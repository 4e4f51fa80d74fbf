"""The pinned llama.cpp: fetch, patch, build, run llama-server, measure and tune it (validation/ checks it)."""
