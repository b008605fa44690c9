"""Train an EAGLE-1 draft head on shards written by :mod:`eagle.train.data`.

``python -m eagle.train.train --base BASE --data DIR[,DIR2...] --out OUT [--val-data DIR2] [--init HEAD] [...]``

Several data folders train together; ``--val-data`` restricts the held-out sequences to some of
them, and ``--init`` continues from an existing head (public EAGLE-1 layout) instead of a random
one. With ``--init``, hold out a folder the initial head never trained on.

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
* held-out top-1: ``argmax lm_head(pred_t) == argmax lm_head(f_{t+1})`` over counted positions of
  the held-out sequences (teacher-forced, depth 1).

Embeddings (the target's ``embed_tokens``) and ``lm_head`` are frozen; only ``fc`` and the decoder
layer train. Input features get uniform noise ``U(-a, a)``, ``a = --noise`` (0.1, EAGLE-1's value;
SmolLM2-135M features have std ~2, so it is a mild perturbation). AdamW, linear warmup then cosine
decay to ``--min-lr-ratio``; progress = max(step / total steps, elapsed / --max-minutes), so a
time-budgeted run still finishes its decay. Gradients clipped to ``--clip``. Checkpoints in the
public EAGLE-1 layout (``EagleHead.save_pretrained``: ``config.json`` + float16
``model.safetensors`` without ``embed_tokens``) plus ``train_log.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle.model.head import EagleHead, head_config_from_base

__all__ = ["load_sequences", "make_batches", "collate", "eagle_loss", "evaluate", "train", "main"]


def peak_rss_gib() -> float:
    """Peak resident set size of this process so far, GiB (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def load_sequences(folder: str | os.PathLike, max_len: int = 512) -> list[dict]:
    """Split the shards of ``folder`` into sequences.

    Returns:
        ``[{"ids": int64 [n], "mask": bool [n], "hidden": float16 [n, H]}]`` (views into the shard
        tensors, truncated to ``max_len`` tokens), sequences with fewer than 3 tokens or no
        response token left out, in shard order.
    """
    from eagle.train.data import load_shards

    seqs = []
    for sh in load_shards(folder):
        off = sh["offsets"].tolist()
        ids = sh["input_ids"].long()
        mask = sh["loss_mask"].bool()
        for a, b in zip(off[:-1], off[1:]):
            b = min(b, a + max_len)
            if b - a < 3 or not mask[a + 1:b].any():
                continue
            seqs.append({"ids": ids[a:b], "mask": mask[a:b], "hidden": sh["hidden"][a:b]})
    return seqs


def make_batches(seqs: list[dict], batch_tokens: int, rng: random.Random, pool: int = 64) -> list[list[int]]:
    """One epoch of batches (lists of indices into ``seqs``).

    Shuffle, sort each pool of ``pool`` sequences by length, cut into batches whose padded size
    ``len(batch) * max_len`` stays within ``batch_tokens`` (at least one sequence), shuffle batches.
    """
    order = list(range(len(seqs)))
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


def collate(seqs: list[dict], idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded batch: ids int64 ``[B, L]`` (pad 0), hidden float32 ``[B, L, H]`` (pad 0),
    mask bool ``[B, L]`` (response token; False on padding)."""
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
    return ids, hid, mask


def eagle_loss(head: EagleHead, lm_head_w: torch.Tensor, ids: torch.Tensor, hid: torch.Tensor, mask: torch.Tensor,
               noise: float = 0.0, w_reg: float = 1.0, w_ce: float = 0.1, ce_frac: float = 1.0,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
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

    Returns:
        (scalar loss with grad, stats: ``reg``, ``ce``, ``acc`` (top-1 agreement), ``n`` counted
        positions, as Python floats/ints).
    """
    feat_in = hid[:, :-1]
    if noise > 0:
        feat_in = feat_in + (torch.rand(feat_in.shape, generator=generator) * 2 - 1) * noise
    pred = head(ids[:, 1:], feat_in)                       # [B, L-1, H] predicted f_{t+1}
    sel = mask[:, 1:]                                      # x_{t+1} is a response token
    p = pred[sel]                                          # [N, H]
    tgt = hid[:, 1:][sel]                                  # [N, H]
    n = int(p.shape[0])
    if n == 0:
        z = pred.sum() * 0.0
        return z, {"reg": 0.0, "ce": 0.0, "acc": 0.0, "n": 0}
    reg = F.smooth_l1_loss(p, tgt, reduction="none").mean(-1).mean()
    if ce_frac < 1.0:  # unbiased estimate of the CE term on a random subset of the positions
        k = max(1, int(round(n * ce_frac)))
        pick = torch.randperm(n, generator=generator)[:k]
        p, tgt = p[pick], tgt[pick]
    with torch.no_grad():
        t_logits = tgt @ lm_head_w.T                       # [N, V]
        t_prob = torch.softmax(t_logits, -1)
        t_top = t_logits.argmax(-1)
        del t_logits
    logp = torch.log_softmax(p @ lm_head_w.T, -1)          # [N, V]
    ce = -(t_prob * logp).sum(-1).mean()
    acc = (logp.argmax(-1) == t_top).float().mean()
    loss = w_reg * reg + w_ce * ce
    return loss, {"reg": float(reg.detach()), "ce": float(ce.detach()), "acc": float(acc), "n": n}


@torch.no_grad()
def evaluate(head: EagleHead, lm_head_w: torch.Tensor, seqs: list[dict], batch_tokens: int,
             w_reg: float = 1.0, w_ce: float = 0.1) -> dict:
    """Held-out loss / top-1 over all counted positions of ``seqs`` (no noise), position-weighted."""
    head.eval()
    tot = {"reg": 0.0, "ce": 0.0, "acc": 0.0, "n": 0}
    for idx in make_batches(seqs, batch_tokens, random.Random(0)):
        _, st = eagle_loss(head, lm_head_w, *collate(seqs, idx), noise=0.0, w_reg=w_reg, w_ce=w_ce)
        for k in ("reg", "ce", "acc"):
            tot[k] += st[k] * st["n"]
        tot["n"] += st["n"]
    head.train()
    n = max(tot["n"], 1)
    out = {k: tot[k] / n for k in ("reg", "ce", "acc")}
    out["loss"] = w_reg * out["reg"] + w_ce * out["ce"]
    out["n"] = tot["n"]
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
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    cfg, emb, lm_w = _load_target_parts(args.base)
    folders = [d for d in args.data.split(",") if d]
    val_folders = [d for d in (args.val_data or args.data).split(",") if d]
    unknown = [d for d in val_folders if d not in folders]
    if unknown:
        raise ValueError(f"--val-data folders {unknown} are not in --data {folders}")
    by_folder = {d: load_sequences(d, args.max_len) for d in folders}
    seqs = [s for d in folders for s in by_folder[d]]
    pool = [s for d in val_folders for s in by_folder[d]]
    if len(seqs) < 2 or not pool:
        raise ValueError(f"{args.data}: need at least 2 usable sequences (and one in --val-data), found {len(seqs)}")
    perm = list(range(len(pool)))
    random.Random(args.seed + 1).shuffle(perm)
    n_val = min(max(1, int(round(len(pool) * args.val_frac))), args.val_max_seqs, len(seqs) - 1)
    val = [pool[i] for i in perm[:n_val]]
    val_ids = {id(s) for s in val}
    tr = [s for s in seqs if id(s) not in val_ids]
    n_tok = sum(len(s["ids"]) for s in tr)
    n_resp = sum(int(s["mask"][1:].sum()) for s in tr)

    head_cfg = head_config_from_base(cfg, bias=True)
    head_cfg._attn_implementation = "sdpa"
    if args.init:  # warm start from an earlier head (public EAGLE-1 layout), trained further in float32
        head = EagleHead.from_pretrained(args.init, embedding=emb).float()
        if head.config.hidden_size != head_cfg.hidden_size or head.config.vocab_size != head_cfg.vocab_size:
            raise ValueError(f"--init {args.init}: head (hidden {head.config.hidden_size}, vocab "
                             f"{head.config.vocab_size}) does not fit the base (hidden {head_cfg.hidden_size}, "
                             f"vocab {head_cfg.vocab_size})")
    else:
        head = EagleHead(head_cfg, with_embeddings=False)
    head.tie_embeddings(emb)
    params = [p for n, p in head.named_parameters() if p.requires_grad and not n.startswith("embed_tokens")]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)

    epoch_batches = len(make_batches(tr, args.batch_tokens, random.Random(0)))
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
           "train_counted_positions": n_resp, "batches_per_epoch": epoch_batches, "planned_steps": total_steps,
           "setup_seconds": round(time.time() - t0, 1), "history": [], "eval": []}

    def save(tag: str):
        head.save_pretrained(out)
        log["saved"] = tag
        log["peak_rss_gib"] = round(peak_rss_gib(), 3)
        with open(out / "train_log.json", "w") as f:
            json.dump(log, f, indent=1)

    def do_eval(step: int):
        ev = evaluate(head, lm_w, val, args.batch_tokens, args.w_reg, args.w_ce)
        ev.update(step=step, minutes=round((time.time() - t_train) / 60, 2))
        log["eval"].append({k: (round(v, 5) if isinstance(v, float) else v) for k, v in ev.items()})
        print(f"[eval] step {step} min {ev['minutes']:.1f} loss {ev['loss']:.4f} reg {ev['reg']:.4f} "
              f"ce {ev['ce']:.3f} top1 {ev['acc']:.4f} (n={ev['n']})", flush=True)

    from tqdm import tqdm

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
        for idx in make_batches(tr, args.batch_tokens, rng):
            lr = lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            loss, st = eagle_loss(head, lm_w, *collate(tr, idx), noise=args.noise, w_reg=args.w_reg,
                                  w_ce=args.w_ce, ce_frac=args.ce_frac, generator=gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, args.clip)
            opt.step()
            step += 1
            bar.update(1)
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
    ap.add_argument("--init", default="", help="start from this head folder (public EAGLE-1 layout) instead of random")
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
    ap.add_argument("--val-frac", type=float, default=0.03)
    ap.add_argument("--val-max-seqs", type=int, default=64)
    ap.add_argument("--eval-minutes", type=float, default=5.0)
    ap.add_argument("--eval-at-start", action="store_true")
    ap.add_argument("--save-minutes", type=float, default=10.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    return train(ap.parse_args(argv))


if __name__ == "__main__":
    main()
