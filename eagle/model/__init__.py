"""The model parts (draft head, KV cache, packed linears, attention, devices), the embedded default and the engine."""
