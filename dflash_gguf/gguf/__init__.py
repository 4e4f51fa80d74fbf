"""The model layer's files: GGUF read (reader.py: every GGUF the project opens) and written (writer.py),
the format both spell (format.py), its key names (keys.py), what a drafter GGUF is (describe.py),
checkpoints and their tensors (checkpoint.py, safetensors_file.py, torch_file.py, quantized.py), the
drafter's layout and config values, the target a drafter serves (target.py, hf_vocab.py), whether the
two fit (drafter_fit.py) and which llama.cpp runs a file (llama_support.py). Below convert/: every command
reads models through here."""
