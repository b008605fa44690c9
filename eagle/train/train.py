"""Train an EAGLE-1 draft head on shards written by :mod:`eagle.train.data`.

``python -m eagle.train.train --base BASE --data DIR[,DIR2...] --out OUT [--val-data DIR2] [--init HEAD] [...]``

Several data folders train together; ``--val-data`` restricts the held-out sequences to some of
them (``--val-data-exclusive``: and none of their sequences is trained on, even beyond
``--val-max-seqs``), and ``--init`` continues from an existing head (public EAGLE-1 layout) instead of a random
one. With ``--init``, hold out a folder the initial head never trained on. ``--kind-weights chat=0.5,qa=2``
changes the corpus mix by resampling: each training sequence is seen ``w`` times per epoch in expectation,
``w`` its record kind's weight (kinds read back from ``--corpus``, :func:`eagle.train.features.sequence_kinds`;
a recall-view shard's sequences have kind ``recall``); ``train_log.json`` records each kind's share before and after.

Alignment (one sequence of tokens ``x_0..x_{L-1}`` with target features ``f_0..f_{L-1}``, where
``f_t`` is the target's last hidden state after its final norm having read ``x_0..x_t``, so
``lm_head(f_t)`` is the target's distribution of ``x_{t+1}``):

* head position ``t`` (``t = 0..L-2``) gets ``(embed(x_{t+1}), f_t + noise)`` and predicts
  ``f_{t+1}``; ``lm_head(pred_t)`` is the draft distribution of ``x_{t+2}``. This is exactly the
  inference-time use: after the target produced ``x_{t+1}`` from ``f_t``, the head drafts
  ``x_{t+2}``.
* the loss at position ``t`` counts when ``x_{t+1}`` is a response token (``loss_mask[t+1]``). The
  first counted position is ``t = P-1`` (``P`` = prompt length): the target's prefill yields
  ``f_{P-1}`` and ``x_P``, and the head's first draft is ``x_{P+1}``. Prompt-internal positions are
  seen as attention context but not trained on.
* loss = SmoothL1(pred_t, f_{t+1}) (mean over H, mean over counted positions; weight
  ``--w-reg`` 1.0) + ``--w-ce`` (0.1) * cross-entropy of ``log_softmax(lm_head(pred_t))`` against
  the target's soft distribution ``softmax(lm_head(f_{t+1}))`` (EAGLE-1). For CPU speed the CE
  term is estimated on a random ``--ce-frac`` (0.25) of the counted positions per batch (the
  full-vocabulary lm_head products dominate a step); evaluation uses every position.
* ``--draft-vocab``: the CE / acceptance terms use only the draft vocabulary's K lm_head rows (both
  laws are softmaxes over those rows: the law the drafter samples from; ~V/K times cheaper), and the
  vocabulary file is copied beside the trained head. Held-out evaluation stays full-vocabulary.
* held-out top-1: ``argmax lm_head(pred_t) == argmax lm_head(f_{t+1})`` over counted positions of
  the held-out sequences (teacher-forced, depth 1).

Embeddings (the target's ``embed_tokens``) and ``lm_head`` are frozen; only ``fc`` and the decoder
layers train. ``--layers N`` sets the head's decoder layers (EAGLE-1: 1; the checkpoint layout is EAGLE-1's
own for any N, see :mod:`eagle.model.head`); with ``--init`` the layers beyond the initial head's are
appended by :func:`eagle.model.head.add_layer` (zero output projections: step 0 is the initial head) and
train at ``--new-layer-lr`` (same warmup and decay). Input features get uniform noise ``U(-a, a)``, ``a = --noise`` (0.1, EAGLE-1's value;
SmolLM2-135M features have std ~2, so it is a mild perturbation). AdamW, linear warmup then cosine
decay to ``--min-lr-ratio``; progress = max(step / total steps, elapsed / --max-minutes), so a
time-budgeted run still finishes its decay. Gradients clipped to ``--clip``. Checkpoints in the
public EAGLE-1 layout (``EagleHead.save_pretrained``: ``config.json`` + float16
``model.safetensors`` without ``embed_tokens``) plus ``train_log.json``.

``--device`` (auto | cpu | cuda | cuda:N; default auto = CUDA when present) holds the head, the frozen
embeddings and lm_head; batches are collated on the CPU from the feature cache and copied there, and the
noise / CE subsets are drawn with a generator on that device (``train(args)`` without ``args.device``:
the CPU).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle.model.head import EagleHead, add_layer, head_config_from_base

__all__ = ["load_sequences", "parse_kind_weights", "weighted_order", "kind_mix", "make_batches", "collate", "lookup_hits", "COPY_NGRAM", "eagle_loss", "unroll_mask", "unrolled_features", "unrolled_loss", "evaluate",
           "train", "main", "release_free_heap", "peak_rss_gib"]


def peak_rss_gib() -> float:
    """Peak resident set size of this process so far, GiB (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def release_free_heap() -> bool:
    """Hand the C allocator's free heap pages back to the system (glibc ``malloc_trim(0)``).

    A long training run allocates and frees many mid-sized tensors each step; glibc keeps the freed
    pages inside its heap, so the resident set grows with fragmentation although the live data does not
    (measured here: 4.1 GiB after 40 steps with glibc's defaults against 2.6 GiB when every block above
    64 KB is mapped and returned). ``malloc_trim`` returns the whole free pages of every arena.

    Returns:
        True when glibc's ``malloc_trim`` was called; False where there is none (another C library or
        OS), in which case nothing happens.
    """
    trim = _glibc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.lru_cache(maxsize=None)
def _glibc_malloc_trim():
    """glibc's ``malloc_trim`` as a ctypes function, or None where the C library has none (looked up once)."""
    import ctypes
    import ctypes.util

    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def load_sequences(folder: str | os.PathLike, max_len: int = 512, corpus: str | os.PathLike | None = None) -> list[dict]:
    """Split the shards of ``folder`` into sequences.

    Args:
        corpus: the token-id corpus the shards were computed from (:mod:`eagle.data.corpus`); when given,
            each sequence also carries its record's ``"kind"`` (:func:`eagle.train.features.sequence_kinds`).

    Returns:
        ``[{"ids": int64 [n], "mask": bool [n], "hidden": float16 [n, H]}]`` (truncated to ``max_len``
        tokens; plus ``"kind"`` with ``corpus``), sequences with fewer than 3 tokens or no response token
        left out, in shard order. ``"hidden"`` is a :class:`eagle.train.data.FeatureRows`: the rows are
        read from the shard file when a batch is collated, so memory holds the token ids and masks
        (~9 bytes per token) and not the features (~1.1 KB per token).

    Raises:
        ValueError: with ``corpus``, a shard whose kinds cannot be recovered (see ``sequence_kinds``).
    """
    from safetensors import safe_open

    from eagle.train.data import feature_rows, shard_paths
    from eagle.train.features import sequence_kinds

    seqs = []
    for path in shard_paths(folder):
        with safe_open(str(path), "pt") as f:
            ids, mask, off = (f.get_tensor(k) for k in ("input_ids", "loss_mask", "offsets"))
        hidden = feature_rows(path)
        off = off.tolist()
        if len(hidden) != off[-1]:
            raise ValueError(f"{path}: {len(hidden)} feature rows for {off[-1]} tokens")
        kinds = sequence_kinds(path, corpus) if corpus is not None else None
        ids, mask = ids.long(), mask.bool()
        for j, (a, b) in enumerate(zip(off[:-1], off[1:])):
            b = min(b, a + max_len)
            if b - a < 3 or not mask[a + 1:b].any():
                continue
            seqs.append({"ids": ids[a:b], "mask": mask[a:b], "hidden": hidden.rows(a, b),
                         **({"kind": kinds[j]} if kinds is not None else {})})
    return seqs


def parse_kind_weights(spec: str) -> dict[str, float]:
    """``"chat=0.5,qa=2"`` -> ``{"chat": 0.5, "qa": 2.0}`` (``--kind-weights``; empty string -> ``{}``).

    Raises:
        ValueError: an item that is not ``KIND=W``, a kind given twice, or a weight that is not a finite
            number >= 0.
    """
    out: dict[str, float] = {}
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        kind, sep, w = item.partition("=")
        kind = kind.strip()
        try:
            val = float(w)
        except ValueError:
            val = float("nan")
        if not sep or not kind:
            raise ValueError(f"--kind-weights: {item!r} is not KIND=WEIGHT")
        if kind in out:
            raise ValueError(f"--kind-weights: kind {kind!r} given twice")
        if not (math.isfinite(val) and val >= 0):
            raise ValueError(f"--kind-weights: weight of {kind!r} must be a finite number >= 0, got {w.strip()!r}")
        out[kind] = val
    return out


def weighted_order(kinds: list[str], weights: dict[str, float], rng: random.Random) -> list[int]:
    """One epoch's sequence indices with each kind re-weighted (the corpus mix changed by resampling).

    Sequence ``i`` of kind ``k`` appears ``floor(w) + Bernoulli(w - floor(w))`` times, ``w =
    weights.get(k, 1.0)``, so its expected count per epoch is ``w`` (0 drops the kind, 2 doubles it).

    Returns:
        Indices into ``kinds`` (unshuffled: :func:`make_batches` shuffles).
    """
    order = []
    for i, k in enumerate(kinds):
        w = weights.get(k, 1.0)
        n = int(math.floor(w))
        n += rng.random() < w - n
        order.extend([i] * n)
    return order


def kind_mix(seqs: list[dict], weights: dict[str, float]) -> dict[str, dict]:
    """Each kind's ``sequences``, counted ``positions``, ``weight``, ``share`` of the positions and
    ``weighted_share`` after :func:`weighted_order` (``seqs`` carry ``"kind"``: :func:`load_sequences` with ``corpus``).

    Raises:
        ValueError: a kind in ``weights`` that no sequence has, or every sequence weighted 0.
    """
    out: dict[str, dict] = {}
    for s in seqs:
        st = out.setdefault(s["kind"], {"sequences": 0, "positions": 0})
        st["sequences"] += 1
        st["positions"] += int(s["mask"][1:].sum())
    unknown = sorted(set(weights) - set(out))
    if unknown:
        raise ValueError(f"--kind-weights: no training sequence has kind {unknown} (kinds here: {sorted(out)})")
    total = sum(v["positions"] for v in out.values())
    total_w = sum(v["positions"] * weights.get(k, 1.0) for k, v in out.items())
    if total_w <= 0:
        raise ValueError("--kind-weights: every training sequence has weight 0")
    for k, v in out.items():
        w = weights.get(k, 1.0)
        v.update(weight=w, share=round(v["positions"] / total, 4), weighted_share=round(v["positions"] * w / total_w, 4))
    return out


def make_batches(seqs: list[dict], batch_tokens: int, rng: random.Random, pool: int = 64,
                 order: list[int] | None = None) -> list[list[int]]:
    """One epoch of batches (lists of indices into ``seqs``).

    Shuffle, sort each pool of ``pool`` sequences by length, cut into batches whose padded size
    ``len(batch) * max_len`` stays within ``batch_tokens`` (at least one sequence), shuffle batches.
    ``order`` (indices, repeats allowed; default every sequence once) is the epoch's multiset, e.g.
    :func:`weighted_order`.
    """
    order = list(range(len(seqs))) if order is None else list(order)
    rng.shuffle(order)
    batches = []
    for p in range(0, len(order), pool):
        chunk = sorted(order[p:p + pool], key=lambda i: len(seqs[i]["ids"]))
        cur: list[int] = []
        for i in chunk:
            n = len(seqs[i]["ids"])
            if cur and (len(cur) + 1) * n > batch_tokens:  # chunk is sorted: n is the max
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(seqs: list[dict], idx: list[int], device: str | torch.device = "cpu"
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded batch: ids int64 ``[B, L]`` (pad 0), hidden float32 ``[B, L, H]`` (pad 0),
    mask bool ``[B, L]`` (response token; False on padding), on ``device`` (assembled on the CPU,
    where the cached features live, then copied)."""
    L = max(len(seqs[i]["ids"]) for i in idx)
    H = seqs[idx[0]]["hidden"].shape[-1]
    ids = torch.zeros(len(idx), L, dtype=torch.long)
    hid = torch.zeros(len(idx), L, H, dtype=torch.float32)
    mask = torch.zeros(len(idx), L, dtype=torch.bool)
    for r, i in enumerate(idx):
        n = len(seqs[i]["ids"])
        ids[r, :n] = seqs[i]["ids"]
        hid[r, :n] = seqs[i]["hidden"].float()
        mask[r, :n] = seqs[i]["mask"]
    return ids.to(device), hid.to(device), mask.to(device)


#: n-gram length of the prompt-lookup rule that defines copy positions (:func:`lookup_hits`)
COPY_NGRAM = 2


def lookup_hits(ids: torch.Tensor, ngram: int = COPY_NGRAM, return_distance: bool = False):
    """Copy positions: where the next token is what prompt lookup would draft from the text so far.

    ``hits[b, i]`` is True when ``ids[b, i + 1]`` equals the token that followed the most recent
    earlier occurrence (ending before ``i``) of the ``ngram`` tokens ``ids[b, i - ngram + 1 .. i]``.
    With the training alignment (module docstring) the loss row of head position ``t`` is mask index
    ``t + 1``, whose flag says whether the token the head drafts there (``x_{t+2}``) continues an
    n-gram already in the context: a copy from the prompt or from the answer so far. Pure and
    vectorised (``[B, L, L]`` booleans), on ``ids``' device.

    Args:
        ids: int64 ``[B, L]`` or ``[L]`` token ids (padding may create matches only among pad positions).
        ngram: length of the matched suffix (>= 1).

        return_distance: also return ``i - k`` (int64, ``ids``' shape), where ``k`` is the end of the
            matched earlier occurrence (0 where there is none): how far back the copy reaches.

    Returns:
        bool tensor of ``ids``' shape; the first ``ngram - 1`` and the last column are False (and the
        distances with ``return_distance``).

    Raises:
        ValueError: ``ngram < 1`` or ``ids`` not 1-D / 2-D.
    """
    if ngram < 1:
        raise ValueError(f"ngram must be >= 1, got {ngram}")
    if ids.dim() not in (1, 2):
        raise ValueError(f"ids must be [L] or [B, L], got shape {tuple(ids.shape)}")
    one = ids.dim() == 1
    x = ids[None] if one else ids
    B, L = x.shape
    if L == 0:
        hits = torch.zeros_like(x, dtype=torch.bool)
        dist = torch.zeros_like(x, dtype=torch.long)
        hits, dist = (hits[0], dist[0]) if one else (hits, dist)
        return (hits, dist) if return_distance else hits
    eq = x[:, :, None] == x[:, None, :]                      # [B, L, L]: x[i] == x[k]
    match = eq.clone()
    for m in range(1, ngram):                                # and x[i-m] == x[k-m]
        shifted = torch.zeros_like(eq)
        shifted[:, m:, m:] = eq[:, :-m, :-m]
        match &= shifted
    i = torch.arange(L, device=x.device)
    match &= (i[None, :] < i[:, None])[None] & (i[None, :] >= ngram - 1)[None] & (i[:, None] >= ngram - 1)[None]
    last = torch.where(match, i[None, None, :], torch.full_like(match, -1, dtype=torch.long)).amax(-1)  # [B, L]
    pred = x.gather(1, (last + 1).clamp(max=L - 1))
    hits = torch.zeros_like(x, dtype=torch.bool)
    hits[:, :-1] = (last[:, :-1] >= 0) & (pred[:, :-1] == x[:, 1:])
    if not return_distance:
        return hits[0] if one else hits
    dist = torch.where(last >= 0, i[None, :] - last, torch.zeros_like(last))
    return (hits[0], dist[0]) if one else (hits, dist)


def _weighted_mean(v: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    return v.mean() if w is None else (v * w).sum() / w.sum()


def _distribution_terms(p: torch.Tensor, tgt: torch.Tensor, lm_head_w: torch.Tensor, ce_frac: float,
                        generator: torch.Generator | None, top_k: int = 4, row_weight: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(soft cross-entropy, 1 - acceptance, top-1 hit per row, top-``top_k`` hit per row) of predicted
    features ``p`` [N, H] against target features ``tgt`` [N, H], on a random ``ce_frac`` of the rows
    (drawn with ``generator``; all rows, in order, when ``ce_frac >= 1``). The hits are bool ``[N']``
    over the rows used; their means are the top-1 / top-``top_k`` agreements. ``row_weight`` (float
    ``[N]``, optional) turns the CE and acceptance means into weighted means.

    ``lm_head_w`` is ``[V', H]``: the full lm_head, or its draft-vocabulary rows (``--draft-vocab``),
    in which case both laws are the softmax over those rows (the target's renormalised on them: per
    position the KL-closest and an acceptance-optimal draft law with that support; positions are
    weighted equally, not by the target's mass on the K rows, and the reported acceptance / agreements
    are then those of the renormalised laws, above the full-vocabulary values of held-out evaluation).
    Acceptance is ``sum_x min(M_b(x), M_s(x))`` at temperature 1, the probability that one child drawn
    from the draft law is accepted by rejection sampling (REFERENCE section 6, LK losses). The agreements reuse the same two ``[N, V']`` products
    (they dominate a step's cost on CPU).
    """
    n = int(p.shape[0])
    if ce_frac < 1.0:  # unbiased estimate on a random subset of the positions
        k = max(1, int(round(n * ce_frac)))
        pick = torch.randperm(n, generator=generator, device=p.device)[:k]
        p, tgt = p[pick], tgt[pick]
        row_weight = None if row_weight is None else row_weight[pick]
    with torch.no_grad():
        t_logits = tgt @ lm_head_w.T                       # [N, V']
        t_prob = torch.softmax(t_logits, -1)
        t_top = t_logits.argmax(-1)
        del t_logits
    logp = torch.log_softmax(p @ lm_head_w.T, -1)          # [N, V']
    ce = _weighted_mean(-(t_prob * logp).sum(-1), row_weight)
    rej = 1.0 - _weighted_mean(torch.minimum(t_prob, logp.exp()).sum(-1), row_weight)
    with torch.no_grad():
        d_top = logp.topk(min(top_k, lm_head_w.shape[0]), -1).indices
        top1_hit = d_top[:, 0] == t_top
        topk_hit = (d_top == t_top[:, None]).any(-1)
    return ce, rej, top1_hit, topk_hit


def eagle_loss(head: EagleHead, lm_head_w: torch.Tensor, ids: torch.Tensor, hid: torch.Tensor, mask: torch.Tensor,
               noise: float = 0.0, w_reg: float = 1.0, w_ce: float = 0.1, ce_frac: float = 1.0,
               generator: torch.Generator | None = None, w_tv: float = 0.0) -> tuple[torch.Tensor, dict]:
    """EAGLE-1 loss on one right-padded batch (alignment in the module docstring).

    Args:
        head: the draft head (embeddings tied to the target's).
        lm_head_w: the target's lm_head weight, float32 ``[V, H]`` (frozen).
        ids: int64 ``[B, L]``; hid: float32 ``[B, L, H]`` target features; mask: bool ``[B, L]``.
        noise: half-width of the uniform noise on input features (feature units).
        ce_frac: fraction of the counted positions (random, drawn with ``generator``) on which the
            cross-entropy (and the reported ``acc``) is computed; the two ``[N, V]`` lm_head
            products dominate the cost on CPU, so 0.25 makes a step ~2.5x cheaper while keeping
            an unbiased estimate of the CE gradient. The regression term always uses all positions.
        w_tv: weight of the acceptance loss ``1 - sum_x min(M_b(x), M_s(x))`` (0 = EAGLE-1 exactly).

    Returns:
        (scalar loss with grad, stats: ``reg``, ``ce``, ``tv`` (1 - acceptance), ``acc`` (top-1
        agreement), ``n`` counted positions, as Python floats/ints).
    """
    feat_in = hid[:, :-1]
    if noise > 0:
        feat_in = feat_in + (torch.rand(feat_in.shape, generator=generator, device=feat_in.device) * 2 - 1) * noise
    pred = head(ids[:, 1:], feat_in)                       # [B, L-1, H] predicted f_{t+1}
    sel = mask[:, 1:]                                      # x_{t+1} is a response token
    p = pred[sel]                                          # [N, H]
    tgt = hid[:, 1:][sel]                                  # [N, H]
    n = int(p.shape[0])
    if n == 0:
        z = pred.sum() * 0.0
        return z, {"reg": 0.0, "ce": 0.0, "tv": 0.0, "acc": 0.0, "n": 0}
    reg = F.smooth_l1_loss(p, tgt, reduction="none").mean(-1).mean()
    ce, rej, top1_hit, _ = _distribution_terms(p, tgt, lm_head_w, ce_frac, generator)
    acc = top1_hit.float().mean()
    loss = w_reg * reg + w_ce * ce + w_tv * rej
    return loss, {"reg": float(reg.detach()), "ce": float(ce.detach()), "tv": float(rej.detach()),
                  "acc": float(acc), "n": n}


def unroll_mask(n: int, step: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Additive attention mask ``[1, 1, n, step * n]`` of unrolled step ``step`` (>= 2).

    Keys are laid out as the head cache holds them: step 1's ``n`` positions (true target features),
    then step 2's, ..., then this step's. The query at head position ``t`` sees what it would see at
    inference at draft depth ``step`` with root position ``r = t - step + 1``: step-1 keys at
    positions ``<= r`` (the committed context), step ``k``'s key at position ``r + k - 1`` for
    ``k = 2..step-1`` (the earlier draft levels of its own chain) and its own key. Rows with
    ``t < step - 1`` have no committed context; they only see themselves and are never counted.
    """
    t = torch.arange(n, device=device)[:, None]
    s = torch.arange(n, device=device)[None, :]
    rooted = t >= step - 1
    blocks = [(s <= t - step + 1) & rooted] + [(s == t - step + k) & rooted for k in range(2, step)] + [s == t]
    visible = torch.cat(blocks, dim=1)
    out = torch.zeros(n, step * n, dtype=dtype, device=device)
    out.masked_fill_(~visible, torch.finfo(dtype).min)
    return out[None, None]


def unrolled_features(head: EagleHead, tokens: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Head outputs of unrolled steps ``1..steps`` (see :func:`unrolled_loss`), each float ``[B, n, H]``.

    Args:
        tokens: int64 ``[B, n]``, ``x_{t+1}`` per head position ``t``.
        features: float ``[B, n, H]``, the target's ``f_t`` (step 1's input).

    Step ``j``'s output at position ``t`` equals what inference computes at draft depth ``j`` with
    root position ``t - j + 1`` when the drafted tokens are ``x_{t-j+2}..x_{t+1}`` (tested).
    """
    from transformers import DynamicCache

    B, n, _ = features.shape
    dtype = features.dtype
    pos = torch.arange(n, device=features.device)[None].expand(B, n)
    cache = DynamicCache(config=head.config)
    causal = torch.zeros(n, n, dtype=dtype, device=features.device).masked_fill_(
        torch.ones(n, n, dtype=torch.bool, device=features.device).triu(1), torch.finfo(dtype).min)[None, None]
    outs = [head(tokens, features, position_ids=pos, attention_mask=causal, cache=cache)]
    for j in range(2, steps + 1):
        prev = outs[-1]
        shifted = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)
        mask = unroll_mask(n, j, dtype, features.device)
        outs.append(head(tokens, shifted, position_ids=pos, attention_mask=mask, cache=cache))
    return outs


def unrolled_loss(head: EagleHead, lm_head_w: torch.Tensor, ids: torch.Tensor, hid: torch.Tensor, mask: torch.Tensor,
                  steps: int, decay: float = 0.8, noise: float = 0.0, w_reg: float = 1.0, w_ce: float = 0.1,
                  ce_frac: float = 1.0, generator: torch.Generator | None = None, w_tv: float = 0.0,
                  top_k: int = 4, copy: torch.Tensor | None = None, copy_weight: float = 1.0,
                  row_hits: bool = False) -> tuple[torch.Tensor, dict]:
    """Multi-step (training-time test) loss: draft depths ``1..steps`` on the head's OWN features.

    Step 1 is EAGLE-1's teacher-forced pass (input ``(x_{t+1}, f_t + noise)``). Step ``j >= 2`` at
    head position ``t`` gets ``(x_{t+1}, o_{j-1}[t-1])``, the feature the head itself predicted one
    level up, and attends as at inference (:func:`unroll_mask`): this is what depth ``j`` of a draft
    tree sees along the accepted path (HASS / EAGLE-3's training-time test, REFERENCE section 6).
    Every step predicts ``f_{t+1}`` with EAGLE-1's terms (SmoothL1 ``w_reg`` + soft CE ``w_ce`` + the
    acceptance term ``w_tv``); step ``j`` is weighted ``decay ** (j - 1)`` and counted where
    ``x_{t+1}`` is a response token and ``t >= j - 1``. Gradients flow through the unrolled features.

    Args:
        ids, hid, mask: as :func:`eagle_loss` (``[B, L]``, ``[B, L, H]`` float32, ``[B, L]`` bool).
        steps: unrolled depths (1 = :func:`eagle_loss`'s terms).
        top_k: also report whether the target's argmax is among the draft's ``top_k`` tokens (on the
            cross-entropy's rows).
        copy: bool ``[B, L]`` copy positions (:func:`lookup_hits` of ``ids``), optional. With it and
            ``ce_frac >= 1`` the stats also hold ``acc_by_depth_copy``, ``topk_by_depth_copy`` and
            ``n_by_depth_copy`` (the rows whose drafted token continues an n-gram of the context).
        copy_weight: loss weight of copy rows relative to the others (1.0: every row alike; needs ``copy``).
            Each term is then a weighted mean over the rows of its depth.
        row_hits: also return, per depth, the counts of each batch row (needs ``ce_frac >= 1``): stats
            ``hit1_by_row``, ``hitk_by_row`` and ``n_by_row``, lists (one per depth) of int64 ``[B]`` tensors
            (for standard errors over sequences, :func:`evaluate`'s ``per_sequence``).

    Returns:
        (scalar loss, stats with ``reg``, ``ce``, ``tv``, ``acc``, ``n`` of depth 1 and lists
        ``acc_by_depth``, ``topk_by_depth``, ``n_by_depth``).

    Raises:
        ValueError: ``steps < 1``, ``copy_weight <= 0``, ``copy_weight != 1`` without ``copy``, or
            ``row_hits`` with ``ce_frac < 1``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not (math.isfinite(copy_weight) and copy_weight > 0) or (copy_weight != 1.0 and copy is None):
        raise ValueError(f"copy_weight must be > 0 and needs copy positions, got {copy_weight} (copy given: "
                         f"{copy is not None})")
    if row_hits and ce_frac < 1.0:
        raise ValueError(f"row_hits needs ce_frac >= 1 (hits on every row), got {ce_frac}")
    split = copy is not None and ce_frac >= 1.0
    feat = hid[:, :-1]
    if noise > 0:
        feat = feat + (torch.rand(feat.shape, generator=generator, device=feat.device) * 2 - 1) * noise
    outs = unrolled_features(head, ids[:, 1:], feat, steps)
    tgt_all = hid[:, 1:]
    total = feat.sum() * 0.0
    stats = {"acc_by_depth": [], "topk_by_depth": [], "n_by_depth": []}
    if split:
        stats.update(acc_by_depth_copy=[], topk_by_depth_copy=[], n_by_depth_copy=[])
    if row_hits:
        stats.update(hit1_by_row=[], hitk_by_row=[], n_by_row=[])
    for j, out in enumerate(outs, start=1):
        sel = mask[:, 1:].clone()
        sel[:, :j - 1] = False
        p, tgt = out[sel], tgt_all[sel]
        m = int(p.shape[0])
        if row_hits:
            row = sel.nonzero()[:, 0]                                             # [m] batch row of each selected row
            stats["n_by_row"].append(sel.sum(1).long().cpu())
        c = copy[:, 1:][sel] if copy is not None else None                      # [m] copy rows
        w = None if copy_weight == 1.0 else 1.0 + (copy_weight - 1.0) * c.float()
        if m:
            reg = _weighted_mean(F.smooth_l1_loss(p, tgt, reduction="none").mean(-1), w)
            ce, rej, hit1, hitk = _distribution_terms(p, tgt, lm_head_w, ce_frac, generator, top_k, row_weight=w)
            acc, topk = hit1.float().mean(), hitk.float().mean()
            if row_hits:
                B = sel.shape[0]
                stats["hit1_by_row"].append(torch.bincount(row, weights=hit1.double(), minlength=B).long().cpu())
                stats["hitk_by_row"].append(torch.bincount(row, weights=hitk.double(), minlength=B).long().cpu())
            total = total + decay ** (j - 1) * (w_reg * reg + w_ce * ce + w_tv * rej)
            if j == 1:
                stats.update(reg=float(reg.detach()), ce=float(ce.detach()), tv=float(rej.detach()), acc=float(acc))
            stats["acc_by_depth"].append(float(acc))
            stats["topk_by_depth"].append(float(topk))
            if split:
                mc = int(c.sum())
                stats["acc_by_depth_copy"].append(float(hit1[c].float().mean()) if mc else 0.0)
                stats["topk_by_depth_copy"].append(float(hitk[c].float().mean()) if mc else 0.0)
                stats["n_by_depth_copy"].append(mc)
        else:
            if row_hits:
                stats["hit1_by_row"].append(torch.zeros(sel.shape[0], dtype=torch.long))
                stats["hitk_by_row"].append(torch.zeros(sel.shape[0], dtype=torch.long))
            if j == 1:
                stats.update(reg=0.0, ce=0.0, tv=0.0, acc=0.0)
            stats["acc_by_depth"].append(0.0)
            stats["topk_by_depth"].append(0.0)
            if split:
                stats["acc_by_depth_copy"].append(0.0)
                stats["topk_by_depth_copy"].append(0.0)
                stats["n_by_depth_copy"].append(0)
        stats["n_by_depth"].append(m)
    stats["n"] = stats["n_by_depth"][0]
    return total, stats


@torch.no_grad()
def evaluate(head: EagleHead, lm_head_w: torch.Tensor, seqs: list[dict], batch_tokens: int,
             w_reg: float = 1.0, w_ce: float = 0.1, depths: int = 1, w_tv: float = 0.0,
             split_copy: bool = False, per_sequence: bool = False) -> dict:
    """Held-out loss / top-1 over all counted positions of ``seqs`` (no noise), position-weighted, on
    ``lm_head_w``'s device (``head`` must be there too).

    With ``depths > 1`` the head is unrolled on its own features (:func:`unrolled_loss`) and the
    result also holds ``acc_by_depth`` / ``top4_by_depth`` / ``n_by_depth`` for draft depths
    ``1..depths``: the probability that the head's argmax (or top 4) contains the target's argmax at
    that depth of the accepted path (the greedy per-level acceptance along the target's own text).
    ``split_copy`` (needs ``depths > 1``) adds ``"copy"`` and ``"other"``: the same three lists over the
    copy positions (:func:`lookup_hits`: the drafted token continues an n-gram of the context) and
    over the rest. ``per_sequence`` (needs ``depths > 1``) adds ``"per_sequence"``: int64 tensors
    ``top1_hits``, ``top4_hits`` and ``n``, each ``[depths, len(seqs)]``, the counts behind the rates per
    sequence of ``seqs`` (in their order), for paired standard errors (:func:`research.heldout.paired_bootstrap`).
    """
    if split_copy and depths < 2:
        raise ValueError("split_copy needs depths >= 2")
    if per_sequence and depths < 2:
        raise ValueError("per_sequence needs depths >= 2")
    ps = torch.zeros(3, depths, len(seqs), dtype=torch.long) if per_sequence else None
    head.eval()
    tot = {"reg": 0.0, "ce": 0.0, "tv": 0.0, "acc": 0.0, "n": 0}
    acc_d = [0.0] * depths
    top_d = [0.0] * depths
    n_d = [0] * depths
    acc_c, top_c, n_c = [0.0] * depths, [0.0] * depths, [0] * depths
    for idx in make_batches(seqs, batch_tokens, random.Random(0)):
        ids, hid, mask = collate(seqs, idx, lm_head_w.device)
        if depths > 1:
            _, st = unrolled_loss(head, lm_head_w, ids, hid, mask, steps=depths, noise=0.0, w_reg=w_reg, w_ce=w_ce,
                                  w_tv=w_tv, copy=lookup_hits(ids) if split_copy else None, row_hits=per_sequence)
            if per_sequence:
                cols = torch.tensor(idx, dtype=torch.long)
                for j in range(depths):
                    ps[0, j, cols] += st["hit1_by_row"][j]
                    ps[1, j, cols] += st["hitk_by_row"][j]
                    ps[2, j, cols] += st["n_by_row"][j]
            for j in range(depths):
                acc_d[j] += st["acc_by_depth"][j] * st["n_by_depth"][j]
                top_d[j] += st["topk_by_depth"][j] * st["n_by_depth"][j]
                n_d[j] += st["n_by_depth"][j]
                if split_copy:
                    acc_c[j] += st["acc_by_depth_copy"][j] * st["n_by_depth_copy"][j]
                    top_c[j] += st["topk_by_depth_copy"][j] * st["n_by_depth_copy"][j]
                    n_c[j] += st["n_by_depth_copy"][j]
        else:
            _, st = eagle_loss(head, lm_head_w, ids, hid, mask, noise=0.0, w_reg=w_reg, w_ce=w_ce, w_tv=w_tv)
        for k in ("reg", "ce", "tv", "acc"):
            tot[k] += st[k] * st["n"]
        tot["n"] += st["n"]
    head.train()
    n = max(tot["n"], 1)
    out = {k: tot[k] / n for k in ("reg", "ce", "tv", "acc")}
    out["loss"] = w_reg * out["reg"] + w_ce * out["ce"] + w_tv * out["tv"]
    out["n"] = tot["n"]
    if depths > 1:
        out["acc_by_depth"] = [acc_d[j] / max(n_d[j], 1) for j in range(depths)]
        out["top4_by_depth"] = [top_d[j] / max(n_d[j], 1) for j in range(depths)]
        out["n_by_depth"] = n_d
    if per_sequence:
        out["per_sequence"] = {"top1_hits": ps[0], "top4_hits": ps[1], "n": ps[2]}
    if split_copy:
        n_o = [n_d[j] - n_c[j] for j in range(depths)]
        out["copy"] = {"acc_by_depth": [acc_c[j] / max(n_c[j], 1) for j in range(depths)],
                       "top4_by_depth": [top_c[j] / max(n_c[j], 1) for j in range(depths)], "n_by_depth": n_c}
        out["other"] = {"acc_by_depth": [(acc_d[j] - acc_c[j]) / max(n_o[j], 1) for j in range(depths)],
                        "top4_by_depth": [(top_d[j] - top_c[j]) / max(n_o[j], 1) for j in range(depths)],
                        "n_by_depth": n_o}
    return out


def _load_target_parts(base: str):
    """(base config, frozen input embedding nn.Embedding, lm_head weight float32 [V, H])."""
    from transformers import AutoModelForCausalLM

    if base == "default":
        from eagle.model.default import default_base_folder

        base = str(default_base_folder())
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    emb = model.get_input_embeddings()
    emb.weight.requires_grad_(False)
    w = model.get_output_embeddings().weight.detach()
    cfg = model.config
    del model
    return cfg, emb, w


def train(args) -> dict:
    """Run training as configured by the parsed CLI ``args``; returns the log dict (also saved)."""
    copy_weight = float(getattr(args, "copy_weight", 1.0))
    if not (math.isfinite(copy_weight) and copy_weight > 0):
        raise ValueError(f"--copy-weight must be a finite number > 0, got {copy_weight}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = getattr(args, "device", "cpu") or "cpu"
    gen = torch.Generator(device=device).manual_seed(args.seed)  # noise and CE subsets, drawn on the device
    t0 = time.time()
    cfg, emb, lm_w = _load_target_parts(args.base)
    emb, lm_w = emb.to(device), lm_w.to(device)
    d2t, dv_meta, lm_w_loss = None, {}, lm_w
    if args.draft_vocab:  # train the distribution terms on the rows the drafter will use
        from eagle.model.head import DRAFT_VOCAB_FILE
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        dv_file = Path(args.draft_vocab)
        dv_file = dv_file / DRAFT_VOCAB_FILE if dv_file.is_dir() else dv_file
        if not dv_file.is_file():
            raise ValueError(f"--draft-vocab {args.draft_vocab}: no {DRAFT_VOCAB_FILE} there")
        try:
            d2t = load_file(str(dv_file))["d2t"].long()
            with safe_open(str(dv_file), "pt") as f:
                dv_meta = dict(f.metadata() or {})
        except (SafetensorError, KeyError, OSError) as e:
            raise ValueError(f"--draft-vocab {dv_file}: not a draft vocabulary file (safetensors with 'd2t'): "
                             f"{e}") from None
        if (d2t.dim() != 1 or d2t.numel() < 2 or int(d2t.min()) < 0 or int(d2t.max()) >= lm_w.shape[0]
                or bool((d2t[1:] <= d2t[:-1]).any())):
            raise ValueError(f"--draft-vocab {dv_file}: d2t must be strictly increasing target ids in "
                             f"[0, {lm_w.shape[0]})")
        lm_w_loss = lm_w[d2t.to(device)].contiguous()
    folders = [d for d in args.data.split(",") if d]
    if args.val_data_exclusive and not args.val_data:
        raise ValueError("--val-data-exclusive needs --val-data (the held-out folders)")
    val_folders = [d for d in (args.val_data or args.data).split(",") if d]
    unknown = [d for d in val_folders if d not in folders]
    if unknown:
        raise ValueError(f"--val-data folders {unknown} are not in --data {folders}")
    kind_weights = parse_kind_weights(getattr(args, "kind_weights", "") or "")
    corpus = (getattr(args, "corpus", "") or None) if kind_weights else None
    if kind_weights and corpus is None:
        from eagle.data.corpus import DEFAULT_ROOT as corpus
    by_folder = {d: load_sequences(d, args.max_len, corpus=corpus) for d in folders}
    seqs = [s for d in folders for s in by_folder[d]]
    pool = [s for d in val_folders for s in by_folder[d]]
    if len(seqs) < 2 or not pool:
        raise ValueError(f"{args.data}: need at least 2 usable sequences (and one in --val-data), found {len(seqs)}")
    perm = list(range(len(pool)))
    random.Random(args.seed + 1).shuffle(perm)
    n_val = min(max(1, int(round(len(pool) * args.val_frac))), args.val_max_seqs, len(seqs) - 1)
    val = [pool[i] for i in perm[:n_val]]
    val_ids = {id(s) for s in (pool if args.val_data_exclusive else val)}
    tr = [s for s in seqs if id(s) not in val_ids]
    if not tr:
        raise ValueError("no training sequences left: with --val-data-exclusive, --data needs a folder that is "
                         "not in --val-data")
    n_tok = sum(len(s["ids"]) for s in tr)
    kind_stats = kind_mix(tr, kind_weights) if kind_weights else {}
    tr_kinds = [s.get("kind", "") for s in tr]

    def epoch_order(r: random.Random):  # None = every training sequence once
        return weighted_order(tr_kinds, kind_weights, r) if kind_weights else None

    n_resp = sum(int(s["mask"][1:].sum()) for s in tr)

    n_layers = int(getattr(args, "layers", 0) or 0)
    head_cfg = head_config_from_base(cfg, bias=True, layers=max(n_layers, 1))
    head_cfg._attn_implementation = "sdpa"
    init_layers = 0
    if args.init:  # warm start from an earlier head (public EAGLE-1 layout), trained further in float32
        head = EagleHead.from_pretrained(args.init, embedding=emb).float()
        if head.config.hidden_size != head_cfg.hidden_size or head.config.vocab_size != head_cfg.vocab_size:
            raise ValueError(f"--init {args.init}: head (hidden {head.config.hidden_size}, vocab "
                             f"{head.config.vocab_size}) does not fit the base (hidden {head_cfg.hidden_size}, "
                             f"vocab {head_cfg.vocab_size})")
        init_layers = len(head.layers)
        if n_layers and n_layers < init_layers:
            raise ValueError(f"--layers {n_layers}: the --init head already has {init_layers} decoder layers")
        while n_layers and len(head.layers) < n_layers:  # new layers start as the identity (add_layer)
            head = add_layer(head)
    else:
        head = EagleHead(head_cfg, with_embeddings=False)
    head.tie_embeddings(emb)
    head.to(device)
    # layers appended to --init by --layers train at --new-layer-lr (same schedule); everything else at --lr
    new_layer_lr = float(getattr(args, "new_layer_lr", 0.0) or 0.0)
    groups = {"old": [], "new": []}
    for name, p in head.named_parameters():
        if p.requires_grad and not name.startswith("embed_tokens"):
            is_new = args.init and name.startswith("layers.") and int(name.split(".")[1]) >= init_layers
            groups["new" if is_new else "old"].append(p)
    if new_layer_lr and not groups["new"]:
        raise ValueError(f"--new-layer-lr: the --init head already has {len(head.layers)} layers, so --layers "
                         f"{n_layers} appends none")
    params = groups["old"] + groups["new"]
    groups = [{"params": groups["old"], "peak_lr": args.lr}] + (
        [{"params": groups["new"], "peak_lr": new_layer_lr or args.lr}] if groups["new"] else [])
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)

    epoch_batches = len(make_batches(tr, args.batch_tokens, random.Random(0), order=epoch_order(random.Random(0))))
    total_steps = args.max_steps or int(math.ceil(args.epochs * epoch_batches))
    budget_s = args.max_minutes * 60 if args.max_minutes else None

    def lr_at(step: int) -> float:
        prog = step / max(total_steps, 1)
        if budget_s:
            prog = max(prog, (time.time() - t_train) / budget_s)
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = min(1.0, prog)
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))

    out = Path(args.out)
    log = {"args": vars(args), "train_sequences": len(tr), "val_sequences": len(val), "train_tokens": n_tok,
           "train_counted_positions": n_resp, **({"kinds": kind_stats} if kind_stats else {}), "batches_per_epoch": epoch_batches, "planned_steps": total_steps,
           "setup_seconds": round(time.time() - t0, 1), "history": [], "eval": []}

    def save(tag: str):
        head.save_pretrained(out)
        if d2t is not None:  # the head runs with the vocabulary it was trained for
            from eagle.train.draft_vocab import save_draft_vocab

            save_draft_vocab(out, d2t, {**dv_meta, "head_trained_on": str(args.draft_vocab)})
        log["saved"] = tag
        log["peak_rss_gib"] = round(peak_rss_gib(), 3)
        with open(out / "train_log.json", "w") as f:
            json.dump(log, f, indent=1)

    def do_eval(step: int):
        ev = evaluate(head, lm_w, val, args.batch_tokens, args.w_reg, args.w_ce, depths=args.eval_depths,
                      w_tv=args.w_tv)
        ev.update(step=step, minutes=round((time.time() - t_train) / 60, 2))
        log["eval"].append({k: (round(v, 5) if isinstance(v, float) else
                                [round(x, 5) if isinstance(x, float) else x for x in v] if isinstance(v, list) else v)
                            for k, v in ev.items()})
        depth = f" top1 by depth {[round(x, 3) for x in ev['acc_by_depth']]}" if "acc_by_depth" in ev else ""
        print(f"[eval] step {step} min {ev['minutes']:.1f} loss {ev['loss']:.4f} reg {ev['reg']:.4f} "
              f"ce {ev['ce']:.3f} top1 {ev['acc']:.4f} (n={ev['n']}){depth}", flush=True)

    from tqdm import tqdm

    bf16 = getattr(args, "autocast", "off") == "bf16"
    trim_every = int(getattr(args, "malloc_trim_steps", 8) or 0)

    def _step_loss(seqs: list[dict], idx: list[int]):
        """The training loss of one batch and its stats (under ``--autocast bf16`` the caller wraps this in autocast)."""
        if args.unroll > 1 or copy_weight != 1.0:
            ids, hid, mask = collate(seqs, idx, device)
            return unrolled_loss(head, lm_w_loss, ids, hid, mask, steps=args.unroll, decay=args.unroll_decay,
                                 noise=args.noise, w_reg=args.w_reg, w_ce=args.w_ce, ce_frac=args.ce_frac,
                                 generator=gen, w_tv=args.w_tv, copy_weight=copy_weight,
                                 copy=lookup_hits(ids) if copy_weight != 1.0 else None)
        return eagle_loss(head, lm_w_loss, *collate(seqs, idx, device), noise=args.noise, w_reg=args.w_reg,
                          w_ce=args.w_ce, ce_frac=args.ce_frac, generator=gen, w_tv=args.w_tv)

    t_train = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if args.eval_at_start:
        do_eval(0)
    step, epoch, stop = 0, 0, False
    last_eval = last_save = time.time()
    run = {"loss": 0.0, "reg": 0.0, "ce": 0.0, "acc": 0.0, "k": 0}
    bar = tqdm(total=total_steps, desc="train", unit="step")
    head.train()
    while not stop:
        for idx in make_batches(tr, args.batch_tokens, rng, order=epoch_order(rng)):
            lr = lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr * g["peak_lr"] / args.lr if args.lr else 0.0
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
                loss, st = _step_loss(tr, idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, args.clip)
            opt.step()
            step += 1
            bar.update(1)
            if trim_every and step % trim_every == 0:
                release_free_heap()
            for k in ("reg", "ce", "acc"):
                run[k] += st[k]
            run["loss"] += float(loss.detach())
            run["k"] += 1
            if step % args.log_every == 0:
                rec = {k: round(run[k] / run["k"], 5) for k in ("loss", "reg", "ce", "acc")}
                rec.update(step=step, epoch=epoch, lr=round(lr, 7), gnorm=round(float(gnorm), 4),
                           minutes=round((time.time() - t_train) / 60, 2))
                log["history"].append(rec)
                bar.set_postfix(loss=rec["loss"], acc=rec["acc"], lr=f"{lr:.1e}")
                run = {"loss": 0.0, "reg": 0.0, "ce": 0.0, "acc": 0.0, "k": 0}
            now = time.time()
            done = step >= total_steps or (budget_s is not None and now - t_train >= budget_s)
            if args.eval_minutes and now - last_eval >= args.eval_minutes * 60 and not done:
                do_eval(step)
                last_eval = time.time()
            if args.save_minutes and now - last_save >= args.save_minutes * 60 and not done:
                save(f"step {step}")
                last_save = time.time()
            if done:
                stop = True
                break
        epoch += 1
    bar.close()
    do_eval(step)
    log.update(steps=step, epochs_completed=round(step / max(epoch_batches, 1), 3),
               train_minutes=round((time.time() - t_train) / 60, 2))
    save(f"final step {step}")
    print(json.dumps({k: log[k] for k in ("steps", "train_minutes", "peak_rss_gib")}), flush=True)
    return log


def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="default", help='HF causal LM path / hub id, or "default"')
    ap.add_argument("--data", required=True, help="folder(s) of shards from eagle.train.data, comma-separated")
    ap.add_argument("--val-data", default="",
                    help="draw the held-out sequences only from these --data folders (default: all); with --init, "
                         "name folders the initial head never trained on, so held-out stays held out")
    ap.add_argument("--val-data-exclusive", action="store_true",
                    help="train on no sequence of the --val-data folders, not only on none of the drawn held-out "
                         "ones (a held-out split larger than --val-max-seqs stays held out for later comparisons)")
    ap.add_argument("--draft-vocab", default="",
                    help="head folder or draft_vocab.safetensors: compute the training CE / acceptance terms over "
                         "these K lm_head rows only (the draft law the drafter will use; ~V/K times cheaper) and "
                         "copy the file beside the trained head; held-out evaluation stays over the full vocabulary")
    ap.add_argument("--init", default="", help="start from this head folder (public EAGLE-1 layout) instead of random")
    ap.add_argument("--layers", type=int, default=0,
                    help="decoder layers of the head (EAGLE-1: 1; 0 = those of --init, else 1). With --init, extra "
                         "layers are appended as the identity (zero o_proj / down_proj) and trained from there")
    ap.add_argument("--new-layer-lr", type=float, default=0.0,
                    help="peak learning rate of the layers --layers appends to --init (0: --lr); same schedule")
    ap.add_argument("--out", required=True, help="head folder (config.json + model.safetensors + train_log.json)")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--max-steps", type=int, default=0, help="overrides --epochs when > 0")
    ap.add_argument("--max-minutes", type=float, default=0.0, help="training time budget (0: none)")
    ap.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per batch")
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--noise", type=float, default=0.1, help="uniform noise half-width on input features")
    ap.add_argument("--w-reg", type=float, default=1.0)
    ap.add_argument("--w-ce", type=float, default=0.1)
    ap.add_argument("--ce-frac", type=float, default=0.25, help="fraction of positions for the CE term")
    ap.add_argument("--w-tv", type=float, default=0.0,
                    help="weight of the acceptance loss 1 - sum_x min(p, q) (LK-style; 0 = EAGLE-1's loss)")
    ap.add_argument("--unroll", type=int, default=1,
                    help="train draft depths 1..k on the head's own features (training-time test; 1 = EAGLE-1)")
    ap.add_argument("--unroll-decay", type=float, default=0.8, help="loss weight of depth j is decay**(j-1)")
    ap.add_argument("--copy-weight", type=float, default=1.0,
                    help="loss weight of copy positions (the drafted token continues a 2-gram already in the context, "
                         "lookup_hits) relative to the others; 1.0 = every position alike")
    ap.add_argument("--kind-weights", default="",
                    help="re-weight the corpus mix by record kind, e.g. chat=0.5,qa=2,recall=1 (expected times each "
                         "sequence is seen per epoch; default 1; 0 drops a kind). Kinds come from --corpus")
    ap.add_argument("--corpus", default="",
                    help="token-id corpus the --data features were computed from, for --kind-weights "
                         "(default: data/distill)")
    ap.add_argument("--eval-depths", type=int, default=1,
                    help="held-out top-1/top-4 per draft depth 1..k (unrolled on the head's own features)")
    ap.add_argument("--val-frac", type=float, default=0.03)
    ap.add_argument("--val-max-seqs", type=int, default=64)
    ap.add_argument("--eval-minutes", type=float, default=5.0)
    ap.add_argument("--eval-at-start", action="store_true")
    ap.add_argument("--save-minutes", type=float, default=10.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--autocast", choices=("off", "bf16"), default="off",
                    help="bf16: the training step's matrix products in bfloat16 (torch.autocast; weights, optimizer "
                         "state and evaluation stay float32); 1.47x per step measured on a 2-thread AVX512-BF16 CPU "
                         "(research.bench_train_step)")
    ap.add_argument("--malloc-trim-steps", type=int, default=8,
                    help="every this many steps hand the allocator's free heap pages back to the system (glibc "
                         "malloc_trim; keeps the resident set near the live data over long runs); 0: never")
    from eagle.train.data import add_device_argument, parse_device

    add_device_argument(ap)
    args = ap.parse_args(argv)
    if not (math.isfinite(args.copy_weight) and args.copy_weight > 0):
        ap.error(f"--copy-weight must be a finite number > 0, got {args.copy_weight}")
    if args.malloc_trim_steps < 0:
        ap.error(f"--malloc-trim-steps must be >= 0, got {args.malloc_trim_steps}")
    if args.layers < 0:
        ap.error(f"--layers must be >= 1 (or 0: those of --init), got {args.layers}")
    if not (math.isfinite(args.new_layer_lr) and args.new_layer_lr >= 0):
        ap.error(f"--new-layer-lr must be a finite number >= 0, got {args.new_layer_lr}")
    if args.new_layer_lr and not (args.init and args.layers):
        ap.error("--new-layer-lr needs --init and --layers (it is the rate of the layers appended to --init)")
    try:
        parse_kind_weights(args.kind_weights)
    except ValueError as e:
        ap.error(str(e))
    if args.corpus and not args.kind_weights:
        ap.error("--corpus is read only for --kind-weights; pass both or neither")
    if args.corpus and not Path(args.corpus).is_dir():
        ap.error(f"--corpus {args.corpus}: not a folder")
    args.device = parse_device(ap, args.device)
    return train(args)


if __name__ == "__main__":
    main()
