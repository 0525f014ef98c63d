"""Bridges to libraries that choose a device themselves (Hugging Face accelerate)."""
