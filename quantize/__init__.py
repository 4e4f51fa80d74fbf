"""Quantized variants, license rules, release folders and Hub publishing."""
