"""The one sampling rule of the project: logits -> processed probabilities.

Draft laws, target laws and the bonus / correction token all go through
:func:`logits_to_probs`, so temperature, top-k and top-p are applied identically
everywhere (an upstream EAGLE bug sampled the bonus token without the processing).
"""
from __future__ import annotations

import math
import numbers

import torch

__all__ = ["SamplingConfig", "logits_to_probs", "check_logits", "sample_from", "sample_with_uniform", "draw_with_uniforms",
           "greedy_token"]


class SamplingConfig:
    """Temperature / top-p / top-k processing shared by target and draft.

    Args:
        temperature: >= 0. 0 means greedy (argmax); the processed law is then one-hot.
        top_p: in (0, 1]; nucleus truncation (1.0 = off). The most probable token is always kept.
        top_k: >= 0; keep the k most probable tokens (0 = off).

    Raises:
        ValueError: on a negative or non-finite temperature, top_p outside (0, 1], or top_k that is
            not a non-negative integer.
    """

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0):
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
            raise ValueError(f"top_k must be an integer >= 0, got {top_k!r}")
        temperature, top_p, top_k = float(temperature), float(top_p), int(top_k)
        if not (math.isfinite(temperature) and temperature >= 0.0):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __repr__(self) -> str:
        return f"SamplingConfig(temperature={self.temperature}, top_p={self.top_p}, top_k={self.top_k})"


def check_logits(logits: torch.Tensor, what: str = "logits") -> None:
    """Raise ``ValueError`` if ``logits`` holds NaN or +/-inf (a silent wrong answer otherwise).

    One min/max reduction (NaN propagates through it, an inf is the min or max): on CPU this is
    ~20x cheaper than ``torch.isfinite(logits).all()``, which materialises a bool tensor.
    """
    if logits.numel() == 0:
        return
    lo, hi = torch.aminmax(logits)
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        bad = (~torch.isfinite(logits)).nonzero()[0].tolist()
        raise ValueError(f"{what} contain NaN or inf (first at index {bad})")


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig, *, check: bool = True) -> torch.Tensor:
    """Processed next-token law from logits.

    Args:
        logits: ``[..., V]`` float tensor (any float dtype); must be finite.
        cfg: the sampling processing (temperature, top-p, top-k).

    Returns:
        ``[..., V]`` float32 probabilities (rows sum to 1). With temperature 0 the row is the
        one-hot of ``argmax`` (lowest index wins a tie, as :func:`greedy_token`). Every
        temperature > 0 is supported: one so small that the processed law is numerically one-hot
        (about 1e-3 times the logit gap and below, down to 5e-324) gives that limit law, the
        uniform law over the tokens tied at the maximum logit (one-hot when the maximum is unique).

    ``check=False`` skips :func:`check_logits` (a host sync) for callers that check the logits
    themselves (the engine, once per cycle).

    Raises:
        ValueError: if ``logits`` holds NaN or inf (with ``check``).
    """
    if check:
        check_logits(logits)
    logits = logits.float()
    if cfg.greedy:
        # zeros + scatter: same values as one_hot(...).float() without its int64 [..., V] intermediate
        return torch.zeros_like(logits).scatter_(-1, greedy_token(logits).unsqueeze(-1), 1.0)
    # shift by the row max first, and keep the maxima at exactly 0: any temperature > 0, however
    # small (even one that rounds to 0 in float32), gives finite / -inf scores, never NaN; the law
    # is then its limit, uniform over the tokens tied at the maximum logit
    d = logits - logits.amax(dim=-1, keepdim=True)
    x = torch.where(d == 0, torch.zeros_like(d), d / cfg.temperature)
    if cfg.top_k > 0 and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = mass_before >= cfg.top_p  # keeps the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def greedy_token(logits_or_probs: torch.Tensor) -> torch.Tensor:
    """``argmax`` over the last dim; ties go to the lowest token id. Returns a LongTensor ``[...]``."""
    return torch.argmax(logits_or_probs, dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of ``probs`` (``[..., V]``, rows summing to 1). Returns LongTensor ``[...]``.

    Raises:
        ValueError: if a row has no positive mass.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    if not (flat.sum(-1) > 0).all():
        raise ValueError("cannot sample from a law with no positive mass")
    out = torch.multinomial(flat.float(), 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])


def draw_with_uniforms(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws on the rows' device, with no host synchronisation.

    Args:
        rows: non-negative float ``[..., V]`` (need not be normalised); u: float ``[...]`` uniforms
            in [0, 1) on the same device (float64 as the verifiers draw them).

    Returns:
        LongTensor ``[...]``: per row the first token x with cdf(x) > u * total. A zero-probability
        token is never returned when the row has mass (where u * total rounds up to the total, the
        first token where the cdf reaches the total, a token with positive probability); a row
        without mass gives 0 (callers fall back first). One cumsum and two binary searches: no
        other pass over the row.
    """
    V = rows.shape[-1]
    flat = rows.reshape(-1, V)
    cdf = torch.cumsum(flat, -1)
    total = cdf[:, -1:]
    x = (u.reshape(-1, 1).to(torch.float64) * total.to(torch.float64)).to(cdf.dtype)
    i = torch.searchsorted(cdf, x, right=True)
    # the cdf is non-decreasing up to the total: the first x with cdf(x) >= total has cdf(x - 1) < total,
    # so positive probability (0 for a row without mass)
    reach = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(i, reach).reshape(rows.shape[:-1])


def sample_with_uniform(row: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw of one token from a non-negative row ``[V]`` (need not be normalised).

    ``u`` in [0, 1) is the uniform; a pure function, so verifiers can take their uniforms as input.
    The host form of :func:`draw_with_uniforms` (two host reads). A zero-probability token is never
    returned. Raises ``ValueError`` if the row has no mass.
    """
    if not float(row.sum()) > 0:
        raise ValueError("cannot sample from a row with no positive mass")
    return int(draw_with_uniforms(row, torch.full((), u, dtype=torch.float64, device=row.device)))
