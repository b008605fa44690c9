"""Where a draft head loses acceptance: held-out top-1 / top-4 per draft depth, several heads side by side.

``python -m research.heldout --heads eagle/data/heads/smollm2-135m-eagle[,OTHER] [--corpus data/distill/smollm2-135m]
[--depths 5] [--max-records 96] [--json out.json]``

The held-out records of the self-distillation corpus (``"split": "heldout"``, 3.75% of the shards,
greedy and sampled, never trained on) are encoded by the target (:mod:`eagle.train.features`), and each head is unrolled on its
own features (:func:`eagle.train.train.evaluate` with ``depths``): at depth ``d`` the head has drafted
``d - 1`` tokens of the target's own continuation and predicts the next one. ``top1[d]`` is the
probability that its argmax is the target's argmax there (the greedy per-level acceptance along the
accepted path), ``top4[d]`` that the target's argmax is among its 4 most probable tokens (what a tree
with 4 children per node can catch). The product of ``top1[1..d]`` bounds a chain's acceptance.

A second table splits top-1 into copy positions and the rest: a position is a copy when the token
the head drafts there continues a 2-gram already in the context (prompt or answer so far), i.e. when
prompt lookup would have drafted it (:func:`eagle.train.train.lookup_hits`). A head that copies well
is far more accurate there than elsewhere; Spec-Bench's summarization, translation and rag answers
are full of such positions.

With two or more heads, a third table pairs each later head against the first: the difference of its
per-depth rates and the bootstrap standard error of that difference over held-out records (a record's
sequences resampled together, the same resample for every head and depth; :func:`paired_bootstrap`).
The two heads see exactly the same positions, so this SE is far smaller than either rate's own.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

__all__ = ["heldout_sequences", "shard_sequences", "depth_summary", "evaluate_heads", "paired_bootstrap", "main"]


def shard_sequences(t: dict) -> list[dict]:
    """Per-sequence views (``ids`` int64, ``mask`` bool, ``hidden``) of a feature shard's tensors
    (:func:`eagle.train.features.build_feature_shard`)."""
    off = t["offsets"].tolist()
    ids, mask = t["input_ids"].long(), t["loss_mask"].bool()
    return [{"ids": ids[a:b], "mask": mask[a:b], "hidden": t["hidden"][a:b]} for a, b in zip(off[:-1], off[1:])]


def depth_summary(r: dict) -> dict:
    """JSON-ready per-depth scores of one :func:`eagle.train.train.evaluate` result: ``top1_by_depth``,
    ``top4_by_depth`` (4 decimals), ``n_by_depth``, and the same for its ``copy`` / ``other`` parts if present."""
    r4 = lambda v: [round(float(x), 4) for x in v]  # noqa: E731
    out = {"top1_by_depth": r4(r["acc_by_depth"]), "top4_by_depth": r4(r["top4_by_depth"]), "n_by_depth": r["n_by_depth"]}
    for part in ("copy", "other"):
        if part in r:
            out[part] = depth_summary(r[part])
    return out


def heldout_sequences(model, corpus, max_records: int, max_len: int | None = None, pad_id: int = 0,
                      temperature: float | None = None, view: str = "answers", tok=None) -> list[dict]:
    """The first ``max_records`` held-out corpus records as training sequences (ids, mask, hidden, the
    record's ``kind``: ``recall-<kind>`` in the recall view, and ``record``: the record's index among
    the records kept, the unit of :func:`paired_bootstrap`).

    ``temperature`` keeps only records generated at that temperature (0.0 greedy, 1.0 sampled).
    ``view="recall"`` scores their recall sequences instead (:mod:`eagle.train.recall`; needs ``tok``;
    those longer than ``max_len`` are left out).
    """
    from eagle.data.corpus import iter_records
    from eagle.train.features import DEFAULT_MAX_LEN, VIEWS, build_feature_shard

    max_len = DEFAULT_MAX_LEN if max_len is None else max_len

    recs = []
    for r in iter_records(corpus, split="heldout"):
        if temperature is not None and float(r["temperature"]) != float(temperature):
            continue
        recs.append(r)
        if len(recs) >= max_records:
            break
    if not recs:
        raise ValueError(f"{corpus}: no held-out records at temperature {temperature} (build them with "
                         f"`python -m research.corpus build --split heldout`)")
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if view == "recall":
        from eagle.train.recall import recall_records

        recs = recall_records(recs, tok, 0, max_len)
    from eagle.train.features import record_kinds, sequences_of

    seqs = shard_sequences(build_feature_shard(model, recs, max_len=max_len, batch_tokens=4096, pad_id=pad_id))
    rec_of = [i for i, r in enumerate(recs) for _ in sequences_of(r, max_len)]
    return [{**s, "kind": k, "record": i} for s, k, i in zip(seqs, record_kinds(recs, max_len), rec_of)]


def paired_bootstrap(a: dict, b: dict, groups: list[int] | torch.Tensor, resamples: int = 1000, seed: int = 0) -> dict:
    """Paired difference ``a - b`` of two heads' per-depth top-1 / top-4 rates on the same sequences, with
    its bootstrap standard error over groups of sequences (held-out records).

    Args:
        a, b: the ``"per_sequence"`` dicts of :func:`eagle.train.train.evaluate` (int64 ``top1_hits``,
            ``top4_hits``, ``n``, each ``[D, S]``) for the same ``S`` sequences in the same order.
        groups: ``[S]`` group (record) index of each sequence; a bootstrap resample draws groups with
            replacement, and the same resample serves both heads and every depth (paired).
        resamples, seed: number of resamples; seed of the CPU generator that draws them.

    Returns:
        ``{"top1_diff_by_depth", "top1_se_by_depth", "top4_diff_by_depth", "top4_se_by_depth"}``, lists of
        ``D`` floats: the difference of the pooled rates (``sum hits / sum n`` over all sequences) and the
        standard deviation of that difference over the resamples.

    Raises:
        ValueError: shapes differ, the counts ``n`` differ (not the same positions), or ``resamples < 2``.
    """
    g = torch.as_tensor(groups, dtype=torch.long)
    n = a["n"]
    if a["top1_hits"].shape != b["top1_hits"].shape or n.shape != b["n"].shape or not torch.equal(n, b["n"]):
        raise ValueError("paired_bootstrap: the two heads were not scored on the same positions")
    if g.numel() != n.shape[1]:
        raise ValueError(f"paired_bootstrap: {g.numel()} group indices for {n.shape[1]} sequences")
    if resamples < 2:
        raise ValueError(f"resamples must be >= 2, got {resamples}")
    _, g = torch.unique(g, return_inverse=True)
    m = int(g.max()) + 1

    def per_group(x: torch.Tensor) -> torch.Tensor:                      # [D, S] -> [D, M] float64
        return torch.zeros(x.shape[0], m, dtype=torch.float64).index_add_(1, g, x.double())

    ng = per_group(n)
    gen = torch.Generator().manual_seed(seed)
    draw = torch.randint(0, m, (resamples, m), generator=gen)
    w = torch.zeros(resamples, m, dtype=torch.float64).scatter_add_(1, draw, torch.ones(resamples, m, dtype=torch.float64))
    nw = (w @ ng.T).clamp_min(1.0)                                          # [R, D] positions per resample
    out = {}
    for key, name in (("top1_hits", "top1"), ("top4_hits", "top4")):
        da = per_group(a[key]) - per_group(b[key])                          # [D, M] hit difference per record
        diff = da.sum(1) / ng.sum(1).clamp_min(1.0)
        boot = (w @ da.T) / nw                                              # [R, D]
        out[f"{name}_diff_by_depth"] = [round(float(x), 5) for x in diff]
        out[f"{name}_se_by_depth"] = [round(float(x), 5) for x in boot.std(0)]
    return out


def target_top1(seqs: list[dict], lm_head_w: torch.Tensor) -> float:
    """How often the text's next token is the target's own top-1 (its last hidden state times
    ``lm_head_w`` [V, H]) over the counted positions of ``seqs``: 1.0 on greedy answers, lower on
    sampled ones, and the share of a recall copy that the target itself would copy."""
    hit = n = 0
    for s in seqs:
        m = s["mask"][1:].to(lm_head_w.device)
        pred = (s["hidden"][:-1].to(lm_head_w) @ lm_head_w.T).argmax(-1)
        hit += int((pred[m] == s["ids"][1:].to(pred.device)[m]).sum())
        n += int(m.sum())
    return hit / max(n, 1)


def evaluate_heads(heads: list[str], seqs: list[dict], model, depths: int = 5, batch_tokens: int = 2048,
                   by_kind: bool = False) -> dict:
    """``{head path: evaluate(...) dict with acc_by_depth / top4_by_depth / n_by_depth}``, each also split
    into ``"copy"`` / ``"other"`` positions (:func:`eagle.train.train.lookup_hits`; ``depths >= 2``), and with
    ``by_kind`` into ``"by_kind": {kind: evaluate(...) dict}`` over the sequences of each record kind (each
    kind is evaluated on its own, so this doubles the time). With ``depths >= 2`` each result also holds
    ``"per_sequence"`` counts (:func:`paired_bootstrap`)."""
    from eagle.model.head import EagleHead

    from eagle.train.train import evaluate

    emb = model.get_input_embeddings()
    w = model.get_output_embeddings().weight.detach().float()
    out = {}
    for h in heads:
        head = EagleHead.from_pretrained(h, embedding=emb).float().to(w.device)
        out[h] = evaluate(head, w, seqs, batch_tokens, depths=depths, split_copy=depths > 1, per_sequence=depths > 1)
        if by_kind:
            kinds = sorted({s.get("kind", "") for s in seqs})
            out[h]["by_kind"] = {k: evaluate(head, w, [s for s in seqs if s.get("kind", "") == k], batch_tokens,
                                             depths=depths) for k in kinds}
    return out


def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point; prints a table and returns the results dict."""
    from eagle.data.corpus import DEFAULT_ROOT, DEFAULT_RUN
    from eagle.train.features import VIEWS
    from eagle.train.data import _pad_id, add_device_argument, load_base, parse_device
    from eagle.train.train import COPY_NGRAM

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", required=True, help="comma-separated head folders (public EAGLE-1 layout)")
    ap.add_argument("--corpus", default=str(DEFAULT_ROOT / DEFAULT_RUN),
                    help="corpus run (or folder) whose first held-out records are the set (default: the fixed one)")
    ap.add_argument("--base", default="default")
    ap.add_argument("--depths", type=int, default=5)
    ap.add_argument("--max-records", type=int, default=96)
    ap.add_argument("--temperature", type=float, default=None,
                    help="only held-out records generated at this temperature (0 greedy, 1 sampled; default all)")
    ap.add_argument("--view", choices=VIEWS, default="answers",
                    help="answers: the records as generated; recall: their recall sequences (a second turn asking "
                         "for a verbatim copy of earlier text, eagle.train.recall), where the target copies")
    ap.add_argument("--by-kind", action="store_true",
                    help="also score each record kind on its own (chat, translation, math, ...; doubles the time)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="also write the results here")
    add_device_argument(ap)
    args = ap.parse_args(argv)
    device = parse_device(ap, args.device)
    heads = [h for h in args.heads.split(",") if h]
    for h in heads:
        if not (Path(h) / "config.json").is_file():
            ap.error(f"--heads: {h} has no config.json")
    if not Path(args.corpus).exists():
        ap.error(f"--corpus {args.corpus}: no such folder")
    if args.depths < 1 or args.max_records < 1:
        ap.error("--depths and --max-records must be >= 1")
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model, tok = load_base(args.base, device=device)
    try:
        seqs = heldout_sequences(model, args.corpus, args.max_records, pad_id=_pad_id(tok), temperature=args.temperature,
                                 view=args.view, tok=tok)
    except ValueError as e:
        ap.error(f"--corpus: {e}")
    if not seqs:
        ap.error(f"--corpus {args.corpus}: none of the first {args.max_records} held-out records gives a sequence to "
                 f"score in the {args.view} view")
    res = evaluate_heads(heads, seqs, model, args.depths, by_kind=args.by_kind)
    t1 = target_top1(seqs, model.get_output_embeddings().weight.detach().float())
    summary = {"corpus": str(args.corpus), "records": args.max_records, "temperature": args.temperature,
               "view": args.view, "target_top1": round(t1, 4), "sequences": len(seqs),
               "positions": int(sum(int(s["mask"][1:].sum()) for s in seqs)), "depths": args.depths,
               "seconds": round(time.time() - t0, 1),
               "heads": {h: {**depth_summary(r), "smoothl1": round(r["reg"], 4), "ce": round(r["ce"], 4),
                             "tv": round(r["tv"], 4),
                             **({"by_kind": {k: depth_summary(v) for k, v in r["by_kind"].items()}}
                                if "by_kind" in r else {})} for h, r in res.items()}}
    print(f"held-out ({args.view}): {summary['sequences']} sequences, {summary['positions']} positions at depth 1; "
          f"the text's next token is the target's own top-1 at {t1:.3f} of them")
    print("| head | " + " | ".join(f"top-1 d{d}" for d in range(1, args.depths + 1)) + " | "
          + " | ".join(f"top-4 d{d}" for d in range(1, args.depths + 1)) + " |")
    print("|---" * (1 + 2 * args.depths) + "|")
    for h, r in summary["heads"].items():
        print(f"| {h} | " + " | ".join(f"{x:.3f}" for x in r["top1_by_depth"]) + " | "
              + " | ".join(f"{x:.3f}" for x in r["top4_by_depth"]) + " |")
    first = next(iter(summary["heads"].values()))
    if "copy" in first:
        share = first["copy"]["n_by_depth"][0] / max(sum(first[p]["n_by_depth"][0] for p in ("copy", "other")), 1)
        print(f"\ntop-1 at copy positions (the drafted token continues a {COPY_NGRAM}-gram already in the context: "
              f"{share:.1%} of depth-1 positions) and at the others")
        print("| head | " + " | ".join(f"copy d{d}" for d in range(1, args.depths + 1)) + " | "
              + " | ".join(f"other d{d}" for d in range(1, args.depths + 1)) + " |")
        print("|---" * (1 + 2 * args.depths) + "|")
        for h, r in summary["heads"].items():
            print(f"| {h} | " + " | ".join(f"{x:.3f}" for x in r["copy"]["top1_by_depth"]) + " | "
                  + " | ".join(f"{x:.3f}" for x in r["other"]["top1_by_depth"]) + " |")
    if args.by_kind:
        kinds = list(first["by_kind"])
        print(f"\ntop-1 at depth 1 / depth {args.depths} per record kind (positions at depth 1)")
        print("| head | " + " | ".join(f"{k} ({first['by_kind'][k]['n_by_depth'][0]})" for k in kinds) + " |")
        print("|---" * (1 + len(kinds)) + "|")
        for h, r in summary["heads"].items():
            print(f"| {h} | " + " | ".join(f"{r['by_kind'][k]['top1_by_depth'][0]:.3f} / "
                                           f"{r['by_kind'][k]['top1_by_depth'][-1]:.3f}" for k in kinds) + " |")
    if len(heads) > 1 and args.depths > 1:
        groups = [s.get("record", i) for i, s in enumerate(seqs)]
        ref = heads[0]
        summary["paired"] = {"reference": ref, "resamples": 1000, "seed": 0,
                             "unit": "held-out record (all its sequences together; the same resample for every head and depth)",
                             "heads": {h: paired_bootstrap(res[h]["per_sequence"], res[ref]["per_sequence"], groups)
                                       for h in heads[1:]}}
        print(f"\npaired against {ref} (difference ± bootstrap SE over {len(set(groups))} records)")
        print("| head | " + " | ".join(f"top-1 d{d}" for d in range(1, args.depths + 1)) + " | "
              + " | ".join(f"top-4 d{d}" for d in range(1, args.depths + 1)) + " |")
        print("|---" * (1 + 2 * args.depths) + "|")
        for h, r in summary["paired"]["heads"].items():
            print(f"| {h} | " + " | ".join(f"{x:+.4f} ± {e:.4f}" for x, e in zip(r["top1_diff_by_depth"], r["top1_se_by_depth"]))
                  + " | " + " | ".join(f"{x:+.4f} ± {e:.4f}" for x, e in zip(r["top4_diff_by_depth"], r["top4_se_by_depth"]))
                  + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
