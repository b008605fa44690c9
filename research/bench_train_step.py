"""Time one draft-head training step in float32 and under bfloat16 autocast, on the same batches.

    python -m research.bench_train_step --data cache/fwb/train --init eagle/data/heads/smollm2-135m-eagle \
        [--max-len 1024] [--batch-tokens 2048] [--unroll 4] [--batches 6] [--threads 2] [--out runs/bench_train_step.json]

What ``eagle.train.train --autocast bf16`` buys and costs. For each of ``--batches`` batches of real features
(``eagle.train.features`` shards) the multi-step loss of issue 13's recipe (``unroll``, w_ce 0.1 on every
position, w_tv 0.5, no input noise so that both modes see the same inputs) is computed and back-propagated
twice, float32 first and then under ``torch.autocast(dtype=torch.bfloat16)``, the two modes alternating so that
machine noise hits both. One warm-up batch per mode is not counted. Reported per mode: the median seconds per
step (forward + backward; the optimizer update is the same float32 AdamW in both and is left out) and training
tokens/s (padded tokens per batch / s); for bf16 also the speed-up over float32 measured side by side, the
relative loss difference and the cosine between the two gradients (all head parameters; 1 = the same step
direction). Prints a markdown table; ``--out`` writes the JSON.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm


def _grad(head, lm_w, ids, hid, mask, unroll: int, bf16: bool):
    from eagle.train.train import unrolled_loss

    head.zero_grad(set_to_none=True)
    t = time.perf_counter()
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss, _ = unrolled_loss(head, lm_w, ids, hid, mask, steps=unroll, noise=0.0, w_ce=0.1, ce_frac=1.0, w_tv=0.5)
    loss.backward()
    dt = time.perf_counter() - t
    g = torch.cat([p.grad.flatten() for p in head.parameters() if p.grad is not None]).double()  # float64 cosine
    return float(loss.detach()), g, dt


def bench(args) -> dict:
    """Run the comparison; returns ``{"config": ..., "rows": [{"mode", "s_per_step", "tokens_per_s", ...}]}``."""
    from eagle.model.head import EagleHead
    from eagle.train.train import _load_target_parts, collate, load_sequences, make_batches

    torch.set_num_threads(args.threads)
    _, emb, lm_w = _load_target_parts(args.base)
    if args.draft_vocab:
        from eagle.train.draft_vocab import load_draft_vocab

        lm_w = lm_w[load_draft_vocab(args.draft_vocab).long()].contiguous()
    head = EagleHead.from_pretrained(args.init, embedding=emb).float()
    head.tie_embeddings(emb)
    head.train()
    seqs = load_sequences(args.data, args.max_len)
    batches = make_batches(seqs, args.batch_tokens, random.Random(0))[: args.batches + 1]
    if len(batches) < 2:
        raise SystemExit(f"--data {args.data}: fewer than 2 batches of {args.batch_tokens} tokens")
    times = {"float32": [], "bf16": []}
    loss_rel, cos, tokens = [], [], []
    for i, idx in enumerate(tqdm(batches, desc="bench_train_step", unit="batch")):
        ids, hid, mask = collate(seqs, idx)
        l32, g32, t32 = _grad(head, lm_w, ids, hid, mask, args.unroll, bf16=False)
        l16, g16, t16 = _grad(head, lm_w, ids, hid, mask, args.unroll, bf16=True)
        if i == 0:  # warm-up
            continue
        times["float32"].append(t32)
        times["bf16"].append(t16)
        tokens.append(int(ids.numel()))
        loss_rel.append(abs(l16 - l32) / max(abs(l32), 1e-12))
        cos.append(float(torch.nn.functional.cosine_similarity(g16, g32, dim=0)))
    tok = statistics.mean(tokens)
    rows = []
    for mode, ts in times.items():
        s = statistics.median(ts)
        row = {"mode": mode, "s_per_step": round(s, 4), "tokens_per_s": round(tok / s, 1)}
        if mode == "bf16":
            row.update(speedup=round(statistics.median(a / b for a, b in zip(times["float32"], ts)), 3),
                       loss_rel_diff_max=round(max(loss_rel), 5), grad_cosine_min=round(min(cos), 5),
                       grad_cosine_mean=round(statistics.mean(cos), 5))
        rows.append(row)
    return {"config": {k: v for k, v in vars(args).items() if k != "out"} | {"padded_tokens_per_batch": tok,
                                                                          "torch": torch.__version__},
            "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a folder of eagle.train.features shards")
    ap.add_argument("--init", required=True, help="head folder (public EAGLE-1 layout)")
    ap.add_argument("--base", default="default")
    ap.add_argument("--draft-vocab", default="", help="a head folder with draft_vocab.safetensors: the distribution terms on its rows "
                                                      "(as --draft-vocab of eagle.train.train)")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--unroll", type=int, default=4)
    ap.add_argument("--batches", type=int, default=6, help="timed batches (one more is the warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if not Path(args.data).is_dir():
        ap.error(f"--data {args.data}: not a folder")
    if not (Path(args.init) / "config.json").is_file():
        ap.error(f"--init {args.init}: no config.json")
    if args.draft_vocab and not (Path(args.draft_vocab) / "draft_vocab.safetensors").is_file():
        ap.error(f"--draft-vocab {args.draft_vocab}: no draft_vocab.safetensors there")
    for flag in ("batches", "unroll", "threads", "batch_tokens"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    res = bench(args)
    print("| mode | s / step | tokens / s | speed-up | max loss rel. diff | grad cosine min / mean |")
    print("|---|---|---|---|---|---|")
    for r in res["rows"]:
        extra = (f"{r['speedup']:.2f}x | {r['loss_rel_diff_max']:.4f} | {r['grad_cosine_min']:.4f} / "
                 f"{r['grad_cosine_mean']:.4f}") if r["mode"] == "bf16" else "1 | | "
        print(f"| {r['mode']} | {r['s_per_step']:.3f} | {r['tokens_per_s']:.0f} | {extra} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
