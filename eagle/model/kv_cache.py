"""KV-cache bookkeeping on transformers' public ``DynamicCache``.

After a verification step the cache must hold exactly the committed prefix plus the accepted
path; :func:`keep_positions` copies only the accepted path's entries down to the end of the prefix
(in place) and shortens each layer to a view, so a step costs O(path) instead of O(prefix) copies.
(``DynamicCache`` still concatenates on every forward, an O(prefix) copy that only a preallocated
cache would remove; see the README's engine notes.)
"""
from __future__ import annotations

import inspect
from functools import lru_cache

import torch
from transformers import DynamicCache

__all__ = ["new_cache", "cache_length", "truncate_cache", "keep_positions", "cache_kwargs"]


@lru_cache(maxsize=None)
def _cache_arg(cls) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module, cache) -> dict:
    """``{name: cache}`` with the keyword ``module.forward`` takes for its KV cache: ``cache``
    (transformers >= 5.2x) or ``past_key_values`` (earlier 5.x, e.g. 5.17)."""
    return {_cache_arg(type(module)): cache}


def new_cache(config) -> DynamicCache:
    """An empty ``DynamicCache`` for a model config."""
    return DynamicCache(config=config)


def cache_length(cache: DynamicCache) -> int:
    """Number of cached positions (tokens)."""
    return int(cache.get_seq_length())


def truncate_cache(cache: DynamicCache, length: int) -> None:
    """Drop every position from ``length`` on (in place).

    Raises:
        ValueError: if ``length`` is negative or beyond the cache.
    """
    cur = cache_length(cache)
    if not 0 <= length <= cur:
        raise ValueError(f"cannot truncate a cache of {cur} positions to {length}")
    if length < cur:
        cache.crop(length - cur)


def keep_positions(cache: DynamicCache, start: int, keep: torch.Tensor) -> None:
    """Keep positions ``[0, start)`` plus ``start + keep`` (in that order) and drop the rest (in place).

    Args:
        cache: the cache after a tree forward (prefix of ``start`` positions + tree nodes).
        start: committed prefix length (positions).
        keep: LongTensor ``[k]``, node offsets (relative to ``start``) of the accepted path, increasing
            (so ``start + keep[j] >= start + j``: copying row by row downwards never overwrites a row
            still to be read; ``index_select`` makes the k rows first anyway).
    """
    k = keep.numel()
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        i = (start + keep).to(device=layer.keys.device, dtype=torch.long)
        keys, values = layer.keys, layer.values
        keys[..., start:start + k, :] = keys.index_select(-2, i)
        values[..., start:start + k, :] = values.index_select(-2, i)
        layer.keys = keys[..., :start + k, :]
        layer.values = values[..., :start + k, :]
