"""EAGLE engine: draft head, static trees, tree decoding, KV cache, drafting and verification."""
__version__ = "0.1.0"
