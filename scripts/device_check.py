"""GPU check of the engine and the verifiers (issue 11, item 6): one NVIDIA GPU, no internet, <= 5 minutes.

    bash scripts/device_check.sh              # on a CUDA machine (writes $OUT or runs/device_check/)
    bash scripts/device_check.sh --dry-run    # tiny shapes on the CPU (what the test suite runs)

Every model is built in place on the device with random weights (the Vicuna-7B-shaped float16 target is
created directly on the GPU: no CPU initialisation, no download). Checks, each recorded as ok / failed
with its numbers:

1. ``verifier_laws``: every registered verifier's (``argmax`` included) exact outcome law on the device, float32 and
   float16 laws, against the same law computed on the CPU in float64 (the CPU law is the one the test
   suite proves exact by enumeration); then sampled ``verify`` outcomes on the device (uniforms drawn
   with a device generator) against that law (Pearson chi-square, p > 1e-4).
2. ``temperature0``: tiny float32 model on the device, ``eagenerate`` == ``naivegenerate`` token for
   token (trees 2x5, mc_sim_7b_63, chain4); float16 equality counted and reported (near-ties may split).
3. ``temperature1_law``: the law of the first two generated tokens of a tiny model on the device equals
   the target's (chi-square, p > 1e-3), every verifier.
4. ``seeded_eagenerate``: every verifier at temperature 1 with a seed, twice: same output; tiny model and
   the 7B-shaped float16 model.
5. ``bench_verify``: ``evaluation.bench_verify`` on the device (quick, V = 32000).
6. ``cycle_7b``: Vicuna-7B-shaped float16 target (random weights) + matching EAGLE-1 head, a 512-token
   context: time of one draft, one tree forward and one verification step per method, on 2x5 and
   mc_sim_7b_63, each the median of CUDA-event timings.
7. ``head_training``: the head-training route (:mod:`eagle.train`) on the device: batched greedy
   generation of a tiny float32 target (``eagle.train.data._generate``) against the CPU's (equal
   answers counted), feature recompute (``eagle.train.features.build_feature_shard``) within 2e-3 of
   the CPU's, then multi-step training steps (``unrolled_loss``, depth 3, feature noise and CE subsets
   drawn with a device generator): the loss must fall and the depth-wise evaluation must run.
8. ``placement_cuda1`` (only when more than one GPU is visible; skipped and ok otherwise, the CPU dry run
   included): a tiny float32 model on ``cuda:1`` (not the current device) generates at temperature 0 what
   it generates on the first GPU, seeded temperature-1 runs repeat, the part timing is recorded; then the
   same model split over ``cuda:0`` (embedding, first layer) and ``cuda:1`` (the rest, lm_head, head)
   with accelerate's ``dispatch_model`` (when accelerate is installed) generates the same tokens.

Output: ``device_check.json`` and ``device_check.md`` (a table) under ``--out`` (default ``$OUT`` if set,
else ``runs/device_check``); exit status 1 when a check failed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import univer_patch  # noqa: E402,F401  (registers traversal / greedy / univer)
from eagle.model.ea_model import EaModel  # noqa: E402
from eagle.model.head import EagleHead, head_config_from_base  # noqa: E402
from eagle.model.kv_cache import new_cache, truncate_cache  # noqa: E402
from eagle.sampling import SamplingConfig, logits_to_probs  # noqa: E402
from eagle.testing import tiny_ea_model  # noqa: E402
from eagle.tree import additive_mask, build_tree  # noqa: E402
from eagle.verify.registry import available_verifiers, get_verifier  # noqa: E402

from eagle.rules import draw_children  # noqa: E402

#: Vicuna-7B v1.3 shapes
VICUNA_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6)
TINY_7B = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-6)


def sampling_methods() -> list[str]:
    return list(available_verifiers(temperature=1.0))


# ---------------------------------------------------------------------- helpers
class Clock:
    """Median milliseconds of ``fn`` over ``reps`` calls: CUDA events on CUDA, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def median_ms(self, fn, reps: int, warmup: int = 1) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def chi2_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson chi-square p-value of ``counts`` against ``law`` (cells with expected < 5 pooled); no scipy."""
    counts, law = counts.double().flatten().cpu(), law.double().flatten().cpu()
    n = counts.sum()
    expected = law / law.sum() * n
    if float(counts[expected <= 0].sum()) > 0:
        return 0.0  # a sample on an impossible outcome
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    df = obs.numel() - 1
    if df < 1:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def random_instance(tree, V: int, rule: str, seed: int):
    """Random laws on ``tree`` (float64, CPU) and children drawn with ``rule``: (parents, tokens, target, draft)."""
    tb = build_tree(tree)
    g = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(tb.num_nodes, V, generator=g, dtype=torch.float64)
    target = torch.softmax(logits, -1)
    draft = torch.softmax(logits + torch.randn(tb.num_nodes, V, generator=g, dtype=torch.float64), -1)
    tokens = torch.zeros(tb.num_nodes, dtype=torch.long)
    for v in range(tb.num_nodes):
        ch = tb.children[v]
        if ch:
            tokens[list(ch)] = draw_children(draft[v:v + 1].float(), len(ch), rule, generator=g)[0]
    return tb.parents.clone(), tokens, target, draft


def build_7b(device, shapes: dict, dtype):
    """Random-weight Llama target of ``shapes`` + a matching EAGLE-1 head, created directly on ``device``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**shapes, tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # parameters are allocated and initialised on the device
            base = LlamaForCausalLM(cfg).eval()
            hcfg = head_config_from_base(cfg)
            hcfg._attn_implementation = "sdpa"
            head = EagleHead(hcfg, with_embeddings=False).eval()
    finally:
        torch.set_default_dtype(old)
    head.tie_embeddings(base.get_input_embeddings())
    return EaModel(base, head, tree_choices="2x5")


# ---------------------------------------------------------------------- checks
def check_verifier_laws(device, dry: bool):
    out = {}
    methods = list(available_verifiers())  # the temperature-0 "argmax" verifier included
    n_samples = 300 if dry else 2000
    for name in methods:
        v = get_verifier(name)
        for tree in ("2x2", "mc_sim_7b_63"):
            parents, tokens, target, draft = random_instance(tree, 6, v.drafting, seed=len(out))
            for dtype in (torch.float32, torch.float16):
                tp, dp = target.to(dtype), draft.to(dtype)
                ref = v.outcome_probs(parents, tokens, tp.double() / tp.double().sum(-1, keepdim=True),
                                      dp.double() / dp.double().sum(-1, keepdim=True))
                law = v.outcome_probs(parents.to(device), tokens.to(device), tp.to(device), dp.to(device))
                err = float((law.double().cpu() - ref.double()).abs().max())
                total = float(law.double().sum())
                tol = 1e-5 if dtype == torch.float32 else 1e-4
                row = {"max_abs_err": err, "sum": total, "ok": err <= tol and abs(total - 1) <= 1e-5}
                if dtype == torch.float32 and tree == "2x2":
                    g = torch.Generator(device=device).manual_seed(7)
                    counts = torch.zeros_like(ref)
                    pa, to, tpd, dpd = parents.to(device), tokens.to(device), tp.to(device), dp.to(device)
                    for _ in range(n_samples):
                        node, y = v.verify(pa, to, tpd, dpd, generator=g)
                        counts[int(node), int(y)] += 1
                    row["chi2_p"] = chi2_pvalue(counts, ref)
                    row["ok"] = row["ok"] and row["chi2_p"] > 1e-4
                out[f"{name}/{tree}/{str(dtype).split('.')[-1]}"] = row
    return all(r["ok"] for r in out.values()), out


def check_temperature0(device, dry: bool):
    out = {"float32_equal": 0, "float32_runs": 0, "float16_equal": 0, "float16_runs": 0}
    for seed in range(2 if dry else 4):
        for dtype in (torch.float32, torch.float16):
            m = tiny_ea_model(vocab_size=256, hidden_size=64, seed=seed, aligned=True).to(device=device, dtype=dtype)
            ids = torch.tensor([[seed + 1, 7, 30, 2]], device=device)
            for tree in ("2x5", "mc_sim_7b_63", "chain4"):
                a = m.eagenerate(ids, max_new_tokens=48, tree_choices=tree)
                b = m.naivegenerate(ids, max_new_tokens=48)
                key = str(dtype).split(".")[-1]
                out[f"{key}_runs"] += 1
                out[f"{key}_equal"] += int(a.tolist() == b.tolist())
    return out["float32_equal"] == out["float32_runs"], out


def check_temperature1_law(device, dry: bool):
    V, prompt, n = 8, [1, 5, 2], (60 if dry else 600)
    m = tiny_ea_model(vocab_size=V, hidden_size=32, seed=4, logit_scale=2.5, aligned=True,
                      align_shrink=0.5).to(device)
    cfg = SamplingConfig(1.0)
    ids = torch.tensor([prompt], device=device)
    _, logits = m.target_forward(ids, torch.arange(3, device=device)[None], new_cache(m.base_model.config))
    p1 = logits_to_probs(logits[0, -1], cfg).double()
    law = torch.zeros(V, V, dtype=torch.float64, device=device)
    for x in range(V):
        seq = torch.cat([ids, torch.tensor([[x]], device=device)], dim=1)
        _, lg = m.target_forward(seq, torch.arange(4, device=device)[None], new_cache(m.base_model.config))
        law[x] = p1[x] * logits_to_probs(lg[0, -1], cfg).double()
    out = {}
    for name in sampling_methods():
        counts = torch.zeros(V, V, dtype=torch.float64)
        for s in range(n):
            o = m.eagenerate(ids, temperature=1.0, max_new_tokens=2, tree_choices="2x2", verifier=name, seed=s)
            counts[int(o[0, 3]), int(o[0, 4])] += 1
        out[name] = {"chi2_p": chi2_pvalue(counts, law), "samples": n}
    return all(r["chi2_p"] > 1e-3 for r in out.values()), out


def check_seeded(device, model, label: str, max_new: int):
    out = {}
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device=device)
    for name in sampling_methods():
        runs = []
        for _ in range(2):
            o, st = model.eagenerate(ids, temperature=1.0, max_new_tokens=max_new, tree_choices="2x5", verifier=name,
                                     seed=123, return_stats=True)
            runs.append(o[0].tolist())
        out[f"{label}/{name}"] = {"same": runs[0] == runs[1], "new_tokens": st["new_tokens"],
                                  "tau": st["new_tokens"] / max(st["decoding_steps"] + 1, 1),
                                  "timing": st["timing"]}
    return all(r["same"] for r in out.values()), out


def check_bench_verify(device, dry: bool):
    from evaluation import bench_verify

    rows = bench_verify.bench(quick=True, devices=[str(device)], trees={"2x5": "2x5", "mc_sim_7b_63": "mc_sim_7b_63"},
                              vocabs=[512 if dry else 32000])
    return True, {"rows": rows}


def check_cycle_7b(device, model, dry: bool):
    """One draft / tree forward / verification step per method on a 512-token context (medians, ms)."""
    clock = Clock(device)
    reps = 3 if dry else 10
    ctx = 64 if dry else 512
    g = torch.Generator(device=device).manual_seed(0)
    V = model.lm_head.weight.shape[0]
    ids = torch.randint(3, V, (1, ctx), device=device, generator=g)
    cfg = SamplingConfig(1.0)
    out = {}
    for tree_name in ("2x5", "mc_sim_7b_63"):
        tree = build_tree(tree_name)
        cache = new_cache(model.base_model.config)
        head_cache = new_cache(model.ea_layer.config)
        feats, _ = model.target_forward(ids[:, :-1], torch.arange(ctx - 1, device=device)[None], cache)
        root_hidden = model.drafter.consume(head_cache, ids[:, 1:], feats)
        prefix = ctx - 1
        row = {"nodes": tree.num_nodes}
        rules = {}
        for name in sampling_methods():
            rule = get_verifier(name).drafting
            if rule not in rules:
                rules[rule] = model.drafter.expand(head_cache, int(ids[0, -1]), root_hidden, tree, rule, cfg, g)
        row["draft_ms"] = clock.median_ms(
            lambda: model.drafter.expand(head_cache, int(ids[0, -1]), root_hidden, tree, "wor", cfg, g), reps)
        d = rules["wor"] if "wor" in rules else next(iter(rules.values()))
        mask = additive_mask(d.ancestor, prefix, model._mask_dtype())

        def tree_forward(d=d, mask=mask):
            model.target_forward(d.tokens[None], (prefix + d.depth)[None], cache, attention_mask=mask)
            truncate_cache(cache, prefix)

        row["tree_forward_ms"] = clock.median_ms(tree_forward, reps)
        for name in sampling_methods():
            v = get_verifier(name)
            d = rules[v.drafting]
            _, tl = model.target_forward(d.tokens[None], (prefix + d.depth)[None], cache,
                                         attention_mask=additive_mask(d.ancestor, prefix, model._mask_dtype()))
            truncate_cache(cache, prefix)
            tp = logits_to_probs(tl[0], cfg)
            # the engine's step: laws it built itself, no input validation (half precision still upcast)
            row[f"{name}_verify_ms"] = clock.median_ms(
                lambda v=v, d=d, tp=tp: v.verify(d.parents, d.tokens, tp, d.draft_probs, g, validate=False), reps)
            row[f"{name}_verify_checked_ms"] = clock.median_ms(
                lambda v=v, d=d, tp=tp: v.verify(d.parents, d.tokens, tp, d.draft_probs, g), reps)
            row[f"{name}_over_forward"] = row[f"{name}_verify_ms"] / row["tree_forward_ms"]
        out[tree_name] = row
    return True, out


# ---------------------------------------------------------------------- driver
def check_head_training(device, dry: bool):
    """Generation, feature recompute and multi-step head training of :mod:`eagle.train` on ``device``."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle.train import features as Fe
    from eagle.train import train as T
    from eagle.train.data import _generate

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    torch.manual_seed(0)
    cpu_model = LlamaForCausalLM(cfg).eval()
    dev_model = LlamaForCausalLM(cfg).eval()
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model.to(device)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=2)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 96, (int(n),), generator=g).tolist() for n in (5, 9, 7, 12)]
    with torch.no_grad():
        a_cpu = _generate(cpu_model, tok, prompts, 16, False, 1.0, 0)
        a_dev = _generate(dev_model, tok, prompts, 16, False, 1.0, 0)
    recs = [{"turns": [{"prompt_ids": p, "answer_ids": a}]} for p, a in zip(prompts, a_cpu)]
    f_cpu = Fe.build_feature_shard(cpu_model, recs, max_len=256, batch_tokens=64, pad_id=0)
    f_dev = Fe.build_feature_shard(dev_model, recs, max_len=256, batch_tokens=64, pad_id=0)
    feat_err = float((f_cpu["hidden"].float() - f_dev["hidden"].float()).abs().max())
    out = {"answers_equal": sum(int(x == y) for x, y in zip(a_cpu, a_dev)), "answers": len(prompts),
           "features_on_cpu": f_dev["hidden"].device.type == "cpu", "feature_max_abs_err": feat_err}
    hcfg = head_config_from_base(cfg, bias=True)
    hcfg._attn_implementation = "sdpa"
    head = EagleHead(hcfg, with_embeddings=False)
    emb = dev_model.get_input_embeddings()
    head.tie_embeddings(emb)
    head.to(device)
    lm_w = dev_model.get_output_embeddings().weight.detach().float()
    off = f_cpu["offsets"].tolist()
    seqs = [{"ids": f_cpu["input_ids"][a:b].long(), "mask": f_cpu["loss_mask"][a:b].bool(),
             "hidden": f_cpu["hidden"][a:b]} for a, b in zip(off[:-1], off[1:])]
    gen = torch.Generator(device=device).manual_seed(0)
    params = [p for n, p in head.named_parameters() if p.requires_grad and not n.startswith("embed_tokens")]
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    with torch.enable_grad():
        head.train()
        for _ in range(10 if dry else 30):
            loss, _st = T.unrolled_loss(head, lm_w, *T.collate(seqs, list(range(len(seqs))), device), steps=3,
                                        noise=0.1, ce_frac=0.5, generator=gen, w_tv=0.2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    ev = T.evaluate(head, lm_w, seqs, 4096, depths=3)
    out.update(first_loss=losses[0], last_loss=losses[-1], eval_top1_by_depth=ev["acc_by_depth"])
    ok = (out["features_on_cpu"] and feat_err <= 2e-3 and losses[-1] < 0.9 * losses[0]
          and len(ev["acc_by_depth"]) == 3)
    return ok, out


def check_placement_cuda1(device, dry: bool):
    """Issue 49 item 5 on two GPUs: ``cuda:1`` and a target sharded over ``cuda:0`` / ``cuda:1``."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type != "cuda" or n < 2:
        return True, {"skipped": f"needs 2 GPUs ({n} visible{', dry run' if dry else ''})"}
    ids = [1, 2, 3, 4, 5, 6]
    out = {}

    def fresh():
        return tiny_ea_model(vocab_size=64, seed=5, aligned=True)

    ref = fresh().to("cuda:0").eagenerate(torch.tensor([ids], device="cuda:0"), max_new_tokens=32, tree_choices="2x5")
    m1 = fresh().to("cuda:1")
    a = m1.eagenerate(torch.tensor([ids]), max_new_tokens=32, tree_choices="2x5")
    out["cuda1_t0_equal"] = a.tolist() == ref.tolist()
    runs = [m1.eagenerate(torch.tensor([ids]), temperature=1.0, max_new_tokens=24, tree_choices="2x5", verifier=v,
                          seed=7, return_stats=True) for v in ("univer", "univer")]
    out["cuda1_seeded_same"] = runs[0][0].tolist() == runs[1][0].tolist()
    out["cuda1_timing"] = runs[0][1]["timing"]
    out["cuda1_placement"] = str(m1.placement)
    ok = out["cuda1_t0_equal"] and out["cuda1_seeded_same"] and runs[0][1]["timing"]["target_forward"] > 0
    try:
        from accelerate import dispatch_model
    except ImportError:
        out["sharded"] = "skipped: accelerate is not installed"
        return ok, out
    ms = fresh()
    dmap = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
            "model.rotary_emb": 1, "lm_head": 1}
    dispatch_model(ms.base_model, device_map=dmap)
    for name, child in ms.ea_layer.named_children():  # the head beside lm_head; its tied embedding stays put
        if name != "embed_tokens":
            child.to("cuda:1")
    out["sharded_placement"] = str(ms.placement)
    b, st = ms.eagenerate(torch.tensor([ids]), max_new_tokens=32, tree_choices="2x5", return_stats=True)
    out["sharded_t0_equal"] = b.tolist() == ref.tolist()
    ms.eagenerate(torch.tensor([ids]), temperature=1.0, max_new_tokens=16, tree_choices="2x5", verifier="univer", seed=1)
    out["sharded_timing"] = st["timing"]
    return ok and out["sharded_t0_equal"] and ms.placement.sharded, out


def table(results: dict) -> str:
    lines = ["| check | ok | seconds | summary |", "|---|---|---|---|"]
    for name, r in results["checks"].items():
        summary = r.get("summary", "")
        lines.append(f"| {name} | {'yes' if r['ok'] else 'NO'} | {r['seconds']:.1f} | {summary} |")
    cyc = results["checks"].get("cycle_7b", {}).get("detail")
    if cyc:
        methods = sampling_methods()
        lines += ["", "| tree | draft ms | tree forward ms | " + " | ".join(f"{m} verify ms (x fwd)" for m in methods) + " |",
                  "|---|---|---|" + "---|" * len(methods)]
        for tree, row in cyc.items():
            cells = [tree, f"{row['draft_ms']:.2f}", f"{row['tree_forward_ms']:.2f}"]
            cells += [f"{row[m + '_verify_ms']:.2f} ({row[m + '_over_forward']:.2f})" for m in methods]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _summary(name, detail) -> str:
    if name == "temperature0":
        return (f"float32 {detail['float32_equal']}/{detail['float32_runs']} equal, "
                f"float16 {detail['float16_equal']}/{detail['float16_runs']}")
    if name == "temperature1_law":
        return ", ".join(f"{k} p={v['chi2_p']:.3g}" for k, v in detail.items())
    if name == "verifier_laws":
        worst = max(detail.items(), key=lambda kv: kv[1]["max_abs_err"])
        return f"{len(detail)} cases, worst |law err| {worst[1]['max_abs_err']:.2e} ({worst[0]})"
    if name.startswith("seeded"):
        return ", ".join(f"{k}: tau {v['tau']:.2f}" for k, v in detail.items())
    if name == "head_training":
        return (f"answers equal {detail['answers_equal']}/{detail['answers']}, |feature err| "
                f"{detail['feature_max_abs_err']:.1e}, loss {detail['first_loss']:.3f} -> {detail['last_loss']:.3f}")
    if name == "placement_cuda1":
        if "skipped" in detail:
            return "skipped: " + detail["skipped"]
        return (f"cuda:1 T0 equal {detail['cuda1_t0_equal']}, seeded same {detail['cuda1_seeded_same']}, sharded "
                f"T0 equal {detail.get('sharded_t0_equal', detail.get('sharded'))}")
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (no GPU needed)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT, else runs/device_check)")
    ap.add_argument("--budget-s", type=float, default=280.0, help="skip the remaining checks after this many seconds")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # tiny shapes gain nothing from threads; on a shared CPU they spin against each other
    if device.type == "cuda" and not torch.cuda.is_available():
        print("device_check: CUDA is not available (use --dry-run for the CPU version)", file=sys.stderr)
        return 2
    out_dir = Path(args.out or os.environ.get("OUT") or "runs/device_check")
    out_dir.mkdir(parents=True, exist_ok=True)
    import transformers

    results = {"env": {"torch": torch.__version__, "transformers": transformers.__version__,
                       "python": platform.python_version(), "device": str(device), "dry_run": args.dry_run,
                       "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None},
               "checks": {}}
    t_start = time.perf_counter()
    big = {}

    def run(name, fn):
        if time.perf_counter() - t_start > args.budget_s:
            results["checks"][name] = {"ok": False, "seconds": 0.0, "summary": "skipped: time budget spent"}
            return
        t0 = time.perf_counter()
        try:
            ok, detail = fn()
            results["checks"][name] = {"ok": bool(ok), "detail": detail, "summary": _summary(name, detail)}
        except Exception as e:  # recorded, the other checks still run
            results["checks"][name] = {"ok": False, "summary": f"{type(e).__name__}: {e}"[:300],
                                       "traceback": traceback.format_exc()}
        results["checks"][name]["seconds"] = time.perf_counter() - t0
        print(f"[device_check] {name}: {'ok' if results['checks'][name]['ok'] else 'FAILED'} "
              f"({results['checks'][name]['seconds']:.1f} s) {results['checks'][name]['summary']}", flush=True)

    def big_model():
        if "m" not in big:
            t0 = time.perf_counter()
            big["m"] = build_7b(device, TINY_7B if args.dry_run else VICUNA_7B,
                                torch.float32 if args.dry_run else torch.float16)
            results["env"]["build_7b_seconds"] = time.perf_counter() - t0
        return big["m"]

    with torch.no_grad():
        run("verifier_laws", lambda: check_verifier_laws(device, args.dry_run))
        run("temperature0", lambda: check_temperature0(device, args.dry_run))
        run("temperature1_law", lambda: check_temperature1_law(device, args.dry_run))
        run("seeded_tiny", lambda: check_seeded(device, tiny_ea_model(vocab_size=64, seed=3, aligned=True).to(device),
                                                "tiny", 24))
        run("cycle_7b", lambda: check_cycle_7b(device, big_model(), args.dry_run))
        run("seeded_7b", lambda: check_seeded(device, big_model(), "7b", 8 if args.dry_run else 32))
        run("bench_verify", lambda: check_bench_verify(device, args.dry_run))
        run("head_training", lambda: check_head_training(device, args.dry_run))
        run("placement_cuda1", lambda: check_placement_cuda1(device, args.dry_run))
    results["seconds"] = time.perf_counter() - t_start
    (out_dir / "device_check.json").write_text(json.dumps(results, indent=1, default=str))
    md = table(results)
    (out_dir / "device_check.md").write_text(md + "\n")
    print(md)
    print(f"[device_check] {results['seconds']:.0f} s; wrote {out_dir / 'device_check.json'} and device_check.md")
    return 0 if all(r["ok"] for r in results["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
