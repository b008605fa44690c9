"""GPU check of the engine, the verifiers and the harness (issues 11 and 49, item 6): one NVIDIA GPU, no
internet, only torch + transformers installed, <= 5 minutes.

    bash scripts/device_check.sh              # on a CUDA machine (writes $OUT or runs/device_check/)
    bash scripts/device_check.sh --dry-run    # tiny shapes on the CPU (what the test suite runs)

Every model is built in place on the device with random weights (the Vicuna-7B-shaped float16 target is
created directly on the GPU: no CPU initialisation, no download). Checks, each recorded as ok / failed
with its numbers (p-values are Pearson chi-square without scipy; cells expected below 5 pooled):

1. ``verifier_laws``: every registered verifier's (``argmax`` included) exact outcome law on the device, in
   float32, float16 and bfloat16 (bfloat16 skipped with the reason where the device has none), against the
   same law computed on the CPU in float64 (the law the test suite proves exact by enumeration); then
   sampled ``verify`` outcomes on the device (uniforms drawn with a device generator) against that law
   (p > 1e-4).
2. ``sync_counts``: host reads per decoding cycle (``eagle.host_reads``, the counter of
   ``tests/test_sync_count.py``), engine included, for every verifier at temperature 1 and ``argmax`` at
   temperature 0 on 2x5 and mc_sim_7b_63 (tiny float32 model on the device, 24 new tokens (12 in the dry run),
   caches warmed by the same call first):
   at most 8 per cycle (``--sync-bound``); on CUDA also the synchronisations reported by
   ``torch.cuda.set_sync_debug_mode("warn")``, same bound.
3. ``temperature0``: tiny model on the device, ``eagenerate`` == ``naivegenerate`` token for token in float32
   (trees 2x5, mc_sim_7b_63, chain4; float16 equality counted and reported, near-ties may split), and in
   float32 with a draft vocabulary (a head with ``d2t``: every other token, and one token, which prunes
   every drafted sibling) on 2x5 and mc_sim_7b_63; pruned trees counted (must be > 0).
4. ``temperature1_law``: the law of the first two generated tokens of a tiny model (V = 8) on the device
   equals the target's exact law (p > 1e-4), every verifier, in float32, float16 and bfloat16 (target
   law computed in the same dtype; bfloat16 skipped with the reason where unsupported), with a draft
   vocabulary that leaves out the target's most likely first token and two more, and with pruned trees
   (4x2 with top-k 3 and with top-p 0.4: drafted nodes the processed draft law cannot fill are dropped;
   pruned trees counted, must be > 0; the law is then the processed target's).
5. ``seeded_tiny`` / ``seeded_7b``: every verifier at temperature 1 with a seed, twice: same output; tiny
   model and the 7B-shaped float16 model.
6. ``cycle_7b``: Vicuna-7B-shaped float16 target (random weights) + matching EAGLE-1 head, a 512-token
   context, on 2x5 and mc_sim_7b_63: one plain decode step (one token through the target + its draw, ms),
   the time of one draft, one tree forward and one verification step per method (medians of CUDA-event
   timings, ms) with the ratio UniVer / RRSw of the verify step (the paper's claim: about 1), and the
   engine's mean cycle time per method (``eagenerate`` from that context, (wall - prefill) / cycles, ms)
   as a multiple of the decode step.
7. ``harness_e2e``: the harness's main job (``evaluation.specbench.run_job`` after the harness's own
   argument checks) on the 7B-shaped model with a Llama tokenizer built offline (a BPE with byte fallback
   trained in memory by the ``tokenizers`` library, ``LlamaTokenizerFast``, exactly the model's vocabulary
   size), the ``vicuna_v1.1`` prompt (chosen by the model family; FastChat's or the harness's built-in copy
   when fschat is absent, compared byte for byte where both exist), 3 Spec-Bench-format questions in a
   temporary question file (one with two turns), plain decoding and every verifier at temperature 1 on 2x5,
   exact tau on one context per question: answers, ``speed.json``, ``table1.md``/``.json``,
   ``exact_tau.md``/``.json`` and ``run.json`` written under ``--out``/harness_e2e.
8. ``bench_verify``: ``evaluation.bench_verify`` on the device (quick, V = 32000).
9. ``head_training``: the head-training route (:mod:`eagle.train`) on the device: batched greedy
   generation of a tiny float32 target (``eagle.train.data._generate``) against the CPU's (equal
   answers counted), feature recompute (``eagle.train.features.build_feature_shard``) within 2e-3 of
   the CPU's, then multi-step training steps (``unrolled_loss``, depth 3, feature noise and CE subsets
   drawn with a device generator): the loss must fall and the depth-wise evaluation must run.
10. ``placement_cuda1`` (only when more than one GPU is visible; skipped and ok otherwise, the CPU dry run
   included): a tiny float32 model on ``cuda:1`` (not the current device) generates at temperature 0 what
   it generates on the first GPU, seeded temperature-1 runs repeat, the part timing is recorded; then the
   same model split over ``cuda:0`` (embedding, first layer) and ``cuda:1`` (the rest, lm_head, head)
   with accelerate's ``dispatch_model`` (when accelerate is installed) generates the same tokens.

Checks run in the order verifier_laws, sync_counts, temperature0, temperature1_law, seeded_tiny, cycle_7b,
harness_e2e, seeded_7b, bench_verify, head_training, placement_cuda1; those that would start after
``--budget-s`` seconds are recorded as skipped (failed). Output: ``device_check.json`` and
``device_check.md`` (tables) under ``--out`` (default ``$OUT`` if set, else ``runs/device_check``); exit
status 1 when a check failed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import univer_patch  # noqa: E402,F401  (registers traversal / greedy / univer)
from eagle.drafting import EagleTreeDrafter  # noqa: E402
from eagle.host_reads import CYCLE_BOUND, counting  # noqa: E402
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


#: temperature-1 law checks: p-value threshold of each chi-square test (about 30 tests per run)
P_MIN = 1e-4
#: harness_e2e: Spec-Bench-format questions (one MT-Bench question with two turns)
HARNESS_QUESTIONS = [
    {"question_id": 81, "category": "writing",
     "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii.",
               "Rewrite your previous response. Start every sentence with the letter A."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate into English: Le chat dort sur la table."]},
    {"question_id": 241, "category": "qa", "turns": ["Why is the sky blue during the day?"]},
]


def sampling_methods() -> list[str]:
    return list(available_verifiers(temperature=1.0))


def half_dtypes(device) -> list[tuple[torch.dtype, str | None]]:
    """float16 and bfloat16 with the reason to skip each on ``device`` (None: supported)."""
    bf16 = None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        bf16 = f"bfloat16 is not supported by {torch.cuda.get_device_name(device)}"
    return [(torch.float16, None), (torch.bfloat16, bf16)]


def dtype_name(dtype) -> str:
    return str(dtype).split(".")[-1]


@contextlib.contextmanager
def count_pruned():
    """Counts drafted static trees (``EagleTreeDrafter.expand`` calls) and those returned pruned (some node
    not drafted: ``DraftTree.nodes`` set) over the block: yields ``{"trees": int, "pruned": int}``."""
    expand = EagleTreeDrafter.expand
    seen = {"trees": 0, "pruned": 0}

    def counted(self, *a, **k):
        d = expand(self, *a, **k)
        seen["trees"] += 1
        seen["pruned"] += int(d.nodes is not None)
        return d

    EagleTreeDrafter.expand = counted
    try:
        yield seen
    finally:
        EagleTreeDrafter.expand = expand


@contextlib.contextmanager
def cuda_syncs_per_cycle(counter, per_cycle: dict):
    """Counts the synchronising CUDA calls ``torch.cuda.set_sync_debug_mode("warn")`` reports, per cycle of
    ``counter`` (an :class:`eagle.host_reads.HostReadCounter` under :func:`eagle.host_reads.counting`)."""
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message).lower():
                per_cycle[counter.cycle] = per_cycle.get(counter.cycle, 0) + 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield per_cycle
        finally:
            torch.cuda.set_sync_debug_mode(prev)


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


def offline_llama_tokenizer(vocab_size: int, corpus: list[str]):
    """A Llama tokenizer built offline: ids 0-2 ``<unk>`` ``<s>`` ``</s>``, the 256 byte-fallback tokens
    ``<0x00>``..``<0xFF>``, then a BPE (``▁`` for spaces, SentencePiece style) trained in memory on ``corpus``
    with the ``tokenizers`` library, padded with ``<extra_i>`` tokens to exactly ``vocab_size`` tokens;
    wrapped as transformers' ``LlamaTokenizerFast`` (BOS added, no chat template).

    Raises:
        ValueError: ``vocab_size`` < 323 (specials, bytes and 64 trained tokens).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    room = vocab_size - len(specials) - len(byte_tokens)
    if room < 64:
        raise ValueError(f"offline_llama_tokenizer: vocab_size {vocab_size} leaves {room} trained tokens (need 64)")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=room, show_progress=False, special_tokens=[]))
    trained = sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])
    merges = json.loads(bpe.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    names = specials + byte_tokens + [t for t, _ in trained if t not in specials]
    names += [f"<extra_{i}>" for i in range(vocab_size - len(names))]
    tok = LlamaTokenizerFast(vocab={t: i for i, t in enumerate(names)}, merges=merges, add_bos_token=True)
    if len(tok) != vocab_size or tok("a").input_ids[0] != 1:
        raise ValueError(f"offline_llama_tokenizer: built {len(tok)} tokens (wanted {vocab_size}) or no BOS first")
    return tok


# ---------------------------------------------------------------------- checks
def check_verifier_laws(device, dry: bool):
    out = {}
    methods = list(available_verifiers())  # the temperature-0 "argmax" verifier included
    n_samples = 300 if dry else 2000
    dtypes = [torch.float32] + [dt for dt, why in half_dtypes(device) if why is None]
    skipped = {dtype_name(dt): why for dt, why in half_dtypes(device) if why is not None}
    for name in methods:
        v = get_verifier(name)
        for tree in ("2x2", "mc_sim_7b_63"):
            parents, tokens, target, draft = random_instance(tree, 6, v.drafting, seed=len(out))
            for dtype in dtypes:
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
                out[f"{name}/{tree}/{dtype_name(dtype)}"] = row
    ok = all(r["ok"] for r in out.values())
    for key, why in skipped.items():
        out[f"skipped/{key}"] = {"skipped": why}
    return ok, out


def check_temperature0(device, dry: bool):
    """eagenerate == naivegenerate at temperature 0: float32 (must), float16 (counted), float32 with a draft
    vocabulary (must; the one-token vocabulary prunes every drafted sibling, pruned trees counted)."""
    out = {"float32_equal": 0, "float32_runs": 0, "float16_equal": 0, "float16_runs": 0}
    for seed in range(2 if dry else 4):
        for dtype in (torch.float32, torch.float16):
            m = tiny_ea_model(vocab_size=256, hidden_size=64, seed=seed, aligned=True).to(device=device, dtype=dtype)
            ids = torch.tensor([[seed + 1, 7, 30, 2]], device=device)
            ref = m.naivegenerate(ids, max_new_tokens=48).tolist()
            for tree in ("2x5", "mc_sim_7b_63", "chain4"):
                a = m.eagenerate(ids, max_new_tokens=48, tree_choices=tree)
                key = dtype_name(dtype)
                out[f"{key}_runs"] += 1
                out[f"{key}_equal"] += int(a.tolist() == ref)
    m = tiny_ea_model(vocab_size=256, hidden_size=64, seed=0, aligned=True).to(device)
    ids = torch.tensor([[1, 7, 30, 2]], device=device)
    new = 24 if dry else 48
    ref = m.naivegenerate(ids, max_new_tokens=new).tolist()
    for label, d2t in (("every_other", torch.arange(0, 256, 2)), ("one_token", torch.tensor([3]))):
        m.ea_layer.set_draft_vocab(d2t)
        row = {"k": int(d2t.numel()), "equal": 0, "runs": 0}
        with count_pruned() as seen:
            for tree in ("2x5", "mc_sim_7b_63"):
                row["runs"] += 1
                row["equal"] += int(m.eagenerate(ids, max_new_tokens=new, tree_choices=tree).tolist() == ref)
        row.update(seen)
        out[f"draft_vocab_{label}"] = row
    m.ea_layer.set_draft_vocab(None)
    ok = (out["float32_equal"] == out["float32_runs"]
          and all(out[k]["equal"] == out[k]["runs"] for k in ("draft_vocab_every_other", "draft_vocab_one_token"))
          and out["draft_vocab_one_token"]["pruned"] > 0)
    return ok, out


def two_token_law(m, prompt, cfg: SamplingConfig) -> torch.Tensor:
    """Exact law ``[V, V]`` (float64, on the model's device) of the first two tokens after ``prompt``
    (``[1, L]`` on the device) under the processed target law ``cfg``, in the model's dtype."""
    device, n = prompt.device, prompt.shape[1]
    V = m.lm_head.weight.shape[0]
    _, logits = m.target_forward(prompt, torch.arange(n, device=device)[None], new_cache(m.base_model.config))
    p1 = logits_to_probs(logits[0, -1].float(), cfg).double()
    law = torch.zeros(V, V, dtype=torch.float64, device=device)
    for x in range(V):
        seq = torch.cat([prompt, torch.tensor([[x]], device=device)], dim=1)
        _, lg = m.target_forward(seq, torch.arange(n + 1, device=device)[None], new_cache(m.base_model.config))
        law[x] = p1[x] * logits_to_probs(lg[0, -1].float(), cfg).double()
    return law


def check_temperature1_law(device, dry: bool):
    """First-two-token law of ``eagenerate`` at temperature 1 against the target's, every verifier, in each
    case of the module docstring (item 4); p > :data:`P_MIN` in every test, pruned trees where asked."""
    V, prompt = 8, [1, 5, 2]
    n_base, n_extra = (40, 20) if dry else (600, 200)
    ids = torch.tensor([prompt], device=device)
    # label -> (dtype, sampling kwargs, tree, samples, draft vocabulary?, must prune?)
    cases = {"float32": (torch.float32, {}, "2x2", n_base, False, False)}
    skipped = {}
    for dt, why in half_dtypes(device):
        if why is None:
            cases[dtype_name(dt)] = (dt, {}, "2x2", n_extra, False, False)
        else:
            skipped[dtype_name(dt)] = why
    cases["draft_vocab"] = (torch.float32, {}, "2x2", n_extra, True, False)
    cases["pruned_top_k3"] = (torch.float32, {"top_k": 3}, "4x2", n_extra, False, True)
    cases["pruned_top_p0.4"] = (torch.float32, {"top_p": 0.4}, "4x2", n_extra, False, True)
    out = {}
    for label, (dtype, sampling, tree, n, vocab, prune) in cases.items():
        m = tiny_ea_model(vocab_size=V, hidden_size=32, seed=4, logit_scale=2.5, aligned=True,
                          align_shrink=0.5).to(device=device, dtype=dtype)
        law = two_token_law(m, ids, SamplingConfig(1.0, **sampling))
        top = None
        if vocab:  # leave out the target's most likely first token and two more: those come only from residuals
            top = int(law.sum(1).argmax())
            m.ea_layer.set_draft_vocab(torch.tensor([t for t in range(V) if t not in (top, (top + 3) % V,
                                                                                   (top + 5) % V)]))
        for name in sampling_methods():
            counts = torch.zeros(V, V, dtype=torch.float64)
            with count_pruned() as seen:
                for s in range(n):
                    o = m.eagenerate(ids, temperature=1.0, max_new_tokens=2, tree_choices=tree, verifier=name, seed=s,
                                     **sampling)
                    counts[int(o[0, 3]), int(o[0, 4])] += 1
            row = {"chi2_p": chi2_pvalue(counts, law), "samples": n, "tree": tree, **seen}
            if top is not None:
                row["k"] = V - 3
                row["left_out_top_token_draws"] = int(counts[top].sum())
            row["ok"] = row["chi2_p"] > P_MIN and (not prune or seen["pruned"] > 0)
            out[f"{label}/{name}"] = row
    ok = all(r["ok"] for r in out.values())
    for key, why in skipped.items():
        out[f"skipped/{key}"] = {"skipped": why}
    return ok, out


def check_sync_counts(device, dry: bool, bound: int = CYCLE_BOUND):
    """Host reads per cycle (engine + verifier) of every verifier at temperature 1 and argmax at temperature
    0 on 2x5 and mc_sim_7b_63, at most ``bound`` in every cycle; on CUDA also the synchronisations the
    sync debug mode reports, same bound. Each case: one warm-up generation, then the same one counted."""
    cuda = device.type == "cuda"
    cases = [("argmax", 0.0)] + [(name, 1.0) for name in sampling_methods()]
    out = {}
    for tree in ("2x5", "mc_sim_7b_63"):
        m = tiny_ea_model(vocab_size=64, seed=0, aligned=True, tree_choices=tree).to(device)
        ids = torch.tensor([[1, 2, 3, 4, 5]], device=device)
        for name, temperature in cases:
            kw = dict(temperature=temperature, max_new_tokens=12 if dry else 24, tree_choices=tree, verifier=name,
                      seed=0)
            m.eagenerate(ids, **kw)  # warm the per-shape caches
            syncs: dict[int, int] = {}
            with counting() as c:
                with (cuda_syncs_per_cycle(c, syncs) if cuda else contextlib.nullcontext()):
                    m.eagenerate(ids, **kw)
            total = c.per_cycle()
            row = {"cycles": c.cycle, "max_reads": max(total, default=0), "mean_reads": statistics.fmean(total or [0]),
                   "max_verifier_reads": max(c.per_cycle("verifier"), default=0),
                   "max_engine_reads": max(c.per_cycle("engine"), default=0)}
            if cuda:
                row["max_cuda_syncs"] = max((syncs.get(k, 0) for k in range(1, c.cycle + 1)), default=0)
                row["prefill_cuda_syncs"] = syncs.get(0, 0)
            row["ok"] = c.cycle >= 2 and row["max_reads"] <= bound and row.get("max_cuda_syncs", 0) <= bound
            if not row["ok"]:
                worst = max(range(1, c.cycle + 1), key=lambda k: total[k - 1]) if c.cycle else 0
                row["worst_cycle_reads"] = c.what.get((worst, "engine"), []) + c.what.get((worst, "verifier"), [])
            out[f"{name}@T{temperature:g}/{tree}"] = row
    return all(r["ok"] for r in out.values()), {"bound": bound, "cases": out}


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
    """On a 512-token context (64 in the dry run), per tree: one plain decode step, one draft, one tree
    forward and one verification step per method (medians, ms), UniVer / RRSw of the verify step, and the
    engine's mean cycle time per method as a multiple of the decode step (module docstring, item 6)."""
    clock = Clock(device)
    reps = 3 if dry else 10
    ctx = 64 if dry else 512
    new_tokens = 6 if dry else 24
    g = torch.Generator(device=device).manual_seed(0)
    V = model.lm_head.weight.shape[0]
    ids = torch.randint(3, V, (1, ctx), device=device, generator=g)
    cfg = SamplingConfig(1.0)
    out = {}
    decode_ms = None
    for tree_name in ("2x5", "mc_sim_7b_63"):
        tree = build_tree(tree_name)
        cache = new_cache(model.base_model.config)
        head_cache = new_cache(model.ea_layer.config)
        feats, _ = model.target_forward(ids[:, :-1], torch.arange(ctx - 1, device=device)[None], cache)
        root_hidden = model.drafter.consume(head_cache, ids[:, 1:], feats)
        prefix = ctx - 1
        if decode_ms is None:
            def decode_step():  # plain decoding's step: the last token through the target, the next one drawn
                _, lg = model.target_forward(ids[:, -1:], torch.tensor([[prefix]], device=device), cache)
                truncate_cache(cache, prefix)
                int(torch.multinomial(logits_to_probs(lg[0, -1].float(), cfg), 1, generator=g))

            decode_ms = clock.median_ms(decode_step, reps)
        row = {"nodes": tree.num_nodes, "decode_step_ms": decode_ms}
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
        if "univer_verify_ms" in row and "rrsw_verify_ms" in row:
            row["univer_over_rrsw_verify"] = row["univer_verify_ms"] / row["rrsw_verify_ms"]
        del cache, head_cache, feats
        for name in sampling_methods():  # the engine's whole cycle from the same context
            kw = dict(temperature=1.0, tree_choices=tree_name, verifier=name, seed=0, return_stats=True)
            model.eagenerate(ids, max_new_tokens=3, **kw)  # warm-up
            _, st = model.eagenerate(ids, max_new_tokens=new_tokens, **kw)
            cycles = max(st["decoding_steps"], 1)
            row[f"{name}_cycle_ms"] = (st["wall_time"] - st["prefill_s"]) / cycles * 1e3
            row[f"{name}_cycle_over_decode"] = row[f"{name}_cycle_ms"] / decode_ms
            row[f"{name}_cycles"] = st["decoding_steps"]
        out[tree_name] = row
    ok = all(math.isfinite(v) and v > 0 for row in out.values() for k, v in row.items() if k.endswith("_ms"))
    return ok, out


def harness_prompt_check(fmt, tok) -> dict:
    """The harness's prompt for a two-turn question: BOS first, Vicuna v1.1 text back from the ids, and the
    built-in copy of ``vicuna_v1.1`` equal to FastChat's where fschat is installed (None where not)."""
    from evaluation.questions import build_messages
    from evaluation.templates import PromptFormat, fschat_installed, render_builtin

    messages = build_messages([q for q in HARNESS_QUESTIONS[0]["turns"]], ["A first answer."])
    text = fmt.render(tok, messages)
    ids = fmt.ids(tok, messages)
    same = None
    if fschat_installed():
        same = all(render_builtin("vicuna_v1.1", build_messages(turns, answers))
                   == PromptFormat("vicuna_v1.1", "fschat", "check").render(None, build_messages(turns, answers))
                   for turns, answers in ((["q1"], []), (["q1", "q2"], ["a1"]), (["q1", "q2", "q3"], ["a1", "a2"])))
    return {"bos_first": ids[0] == tok.bos_token_id, "roundtrip": tok.decode(ids[1:]) == text,
            "vicuna_text": text.endswith("USER: " + messages[-1]["content"] + " ASSISTANT:") and "</s>USER:" in text,
            "prompt_tokens": len(ids), "builtin_equals_fschat": same}


def check_harness_e2e(device, model, out_dir: Path, dry: bool):
    """The harness's main job on ``model`` (module docstring, item 7); outputs in ``out_dir``/harness_e2e."""
    from evaluation import specbench as SB
    from evaluation import tables as T
    from evaluation.arguments import BASELINE, OneLineParser, add_common_arguments, check_arguments
    from evaluation.gen_answer import answer_file_name
    from evaluation.templates import choose_format

    V = model.lm_head.weight.shape[0]
    dest = out_dir / "harness_e2e"
    if dest.exists():
        shutil.rmtree(dest)  # a previous run's answers would be resumed, not regenerated
    corpus = [t for q in HARNESS_QUESTIONS for t in q["turns"]] + [
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the user's questions. USER: Hello! ASSISTANT: Hello, how can I help?"]
    tok = offline_llama_tokenizer(V, corpus)
    with tempfile.TemporaryDirectory(prefix="device_check_harness_") as tmp:
        tmp = Path(tmp)
        qfile = tmp / "question.jsonl"
        qfile.write_text("".join(json.dumps(q) + "\n" for q in HARNESS_QUESTIONS), encoding="utf-8")
        model_dir = tmp / "random-vicuna-7b-shaped"  # config + tokenizer (no weights): the family names the format
        model.base_model.config.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        head_dir = model.ea_layer.save_pretrained(tmp / "random-head")
        ap = OneLineParser(prog="device_check harness_e2e")
        add_common_arguments(ap, positional=True)
        argv = [str(model_dir), "1.0", "--head", str(head_dir), "--tree", "2x5", "--speed-tree", "none",
                "--seeds", "0", "--max-new-tokens", "8" if dry else "16", "--question-file", str(qfile),
                "--contexts-per-question", "1", "--draws", "1", "--bootstrap", "50", "--no-plots", "--no-progress",
                "--device", str(device), "--dtype", dtype_name(model.lm_head.weight.dtype), "--out", str(dest)]
        cfg = check_arguments(ap.parse_args(argv))
        fmt = choose_format(cfg.model, tok, cfg.template)
        saved = model.tokenizer
        model.tokenizer = tok
        try:
            run = SB.run_job(cfg, model, fmt)
        finally:
            model.tokenizer = saved
        prompt = harness_prompt_check(fmt, tok)
    methods = [BASELINE] + [m for m in cfg.methods if m != BASELINE]
    files = {m: dest / "answers" / answer_file_name(m, 1.0, None if m == BASELINE else "2x5", 0) for m in methods}
    records = {m: [json.loads(x) for x in f.read_text().splitlines()] if f.is_file() else [] for m, f in files.items()}
    written = [n for n in ("speed.json", "table1.md", "table1.json", "exact_tau.md", "exact_tau.json", "run.json")
               if (dest / n).is_file()]
    table1 = (dest / "table1.md").read_text() if (dest / "table1.md").is_file() else ""
    rows = json.loads((dest / "table1.json").read_text())["rows"] if (dest / "table1.json").is_file() else []
    tau = {r["method"]: {"avg_tau": r["avg_tau"], "speedup": r["speedup"]} for r in rows}
    detail = {"methods": methods, "questions": len(HARNESS_QUESTIONS), "prompt_format": fmt.describe(),
              "answers_per_method": {m: len(r) for m, r in records.items()}, "written": written,
              "stage_seconds": run["stage_seconds"], "prompt": prompt, "tokenizer_size": len(tok),
              "out": str(dest), "table1": tau}
    ok = (fmt.name == "vicuna_v1.1"
          and all(len(r) == len(HARNESS_QUESTIONS) for r in records.values())
          and all(rec["prompt_format"]["name"] == "vicuna_v1.1" for r in records.values() for rec in r)
          and len(written) == 6 and all(T.method_label(m) in table1 for m in cfg.methods if m != BASELINE)
          and prompt["bos_first"] and prompt["roundtrip"] and prompt["vicuna_text"]
          and prompt["builtin_equals_fschat"] is not False)
    return ok, detail


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
    """The report: one line per check, then the host reads per cycle and the 7B-shaped timings."""
    lines = ["| check | ok | seconds | summary |", "|---|---|---|---|"]
    for name, r in results["checks"].items():
        summary = r.get("summary", "")
        lines.append(f"| {name} | {'yes' if r['ok'] else 'NO'} | {r['seconds']:.1f} | {summary} |")
    sync = results["checks"].get("sync_counts", {}).get("detail")
    if sync:
        lines += ["", f"Host reads per cycle (bound {sync['bound']}; CUDA: synchronisations reported by the sync debug "
                      "mode):", "", "| case | cycles | max reads | mean reads | max verifier reads | max CUDA syncs |",
                  "|---|---|---|---|---|---|"]
        for case, row in sync["cases"].items():
            lines.append(f"| {case} | {row['cycles']} | {row['max_reads']} | {row['mean_reads']:.1f} | "
                         f"{row['max_verifier_reads']} | {row.get('max_cuda_syncs', 'n/a (CPU)')} |")
    cyc = results["checks"].get("cycle_7b", {}).get("detail")
    if cyc:
        methods = sampling_methods()
        lines += ["", "| tree | draft ms | tree forward ms | " + " | ".join(f"{m} verify ms (x fwd)" for m in methods)
                  + " | UniVer / RRSw verify |", "|---|---|---|" + "---|" * (len(methods) + 1)]
        for tree, row in cyc.items():
            cells = [tree, f"{row['draft_ms']:.2f}", f"{row['tree_forward_ms']:.2f}"]
            cells += [f"{row[m + '_verify_ms']:.2f} ({row[m + '_over_forward']:.2f})" for m in methods]
            cells.append(f"{row['univer_over_rrsw_verify']:.2f}" if "univer_over_rrsw_verify" in row else "n/a")
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "| tree | plain decode step ms | " + " | ".join(f"{m} cycle ms (x decode step)" for m in methods)
                  + " |", "|---|---|" + "---|" * len(methods)]
        for tree, row in cyc.items():
            cells = [tree, f"{row['decode_step_ms']:.2f}"]
            cells += [f"{row[m + '_cycle_ms']:.2f} ({row[m + '_cycle_over_decode']:.2f})" for m in methods]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _summary(name, detail) -> str:
    skipped = "; ".join(f"{k.split('/', 1)[1]} skipped: {v['skipped']}" for k, v in detail.items()
                        if isinstance(v, dict) and k.startswith("skipped/"))
    skipped = f"; {skipped}" if skipped else ""
    if name == "temperature0":
        dv = [f"{k[len('draft_vocab_'):]} (K={v['k']}) {v['equal']}/{v['runs']}, {v['pruned']}/{v['trees']} trees "
              f"pruned" for k, v in detail.items() if k.startswith("draft_vocab_")]
        return (f"float32 {detail['float32_equal']}/{detail['float32_runs']} equal, "
                f"float16 {detail['float16_equal']}/{detail['float16_runs']}; draft vocabulary: " + ", ".join(dv))
    if name == "temperature1_law":
        rows = {k: v for k, v in detail.items() if not k.startswith("skipped/")}
        cases = {}
        for k, v in rows.items():
            cases.setdefault(k.split("/")[0], []).append(v)
        parts = []
        for case, vs in cases.items():
            part = f"{case} min p={min(v['chi2_p'] for v in vs):.3g}"
            if case.startswith("pruned"):
                part += f" ({sum(v['pruned'] for v in vs)}/{sum(v['trees'] for v in vs)} trees pruned)"
            parts.append(part)
        return f"{len(rows)} tests (p > {P_MIN:g}): " + ", ".join(parts) + skipped
    if name == "verifier_laws":
        rows = {k: v for k, v in detail.items() if not k.startswith("skipped/")}
        worst = max(rows.items(), key=lambda kv: kv[1]["max_abs_err"])
        return f"{len(rows)} cases, worst |law err| {worst[1]['max_abs_err']:.2e} ({worst[0]})" + skipped
    if name == "sync_counts":
        cases = detail["cases"]
        worst = max(cases.items(), key=lambda kv: kv[1]["max_reads"])
        text = (f"{len(cases)} cases, max {worst[1]['max_reads']} host reads per cycle ({worst[0]}; bound "
                f"{detail['bound']})")
        if any("max_cuda_syncs" in r for r in cases.values()):
            text += f", max {max(r['max_cuda_syncs'] for r in cases.values())} CUDA syncs per cycle"
        return text
    if name == "cycle_7b":
        return "; ".join(
            f"{tree}: decode step {row['decode_step_ms']:.2f} ms, univer cycle "
            f"{row.get('univer_cycle_over_decode', float('nan')):.2f}x decode, univer/rrsw verify "
            f"{row.get('univer_over_rrsw_verify', float('nan')):.2f}"
            for tree, row in detail.items())
    if name == "harness_e2e":
        return (f"{len(detail['methods'])} methods x {detail['questions']} questions, prompt "
                f"{detail['prompt_format']['name']} ({detail['prompt_format']['source']}), Llama tokenizer of "
                f"{detail['tokenizer_size']} tokens, wrote {', '.join(detail['written'])}")
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
    ap.add_argument("--sync-bound", type=int, default=CYCLE_BOUND,
                    help=f"sync_counts: most host reads per cycle (default {CYCLE_BOUND}, issue 49's goal)")
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
        run("sync_counts", lambda: check_sync_counts(device, args.dry_run, args.sync_bound))
        run("temperature0", lambda: check_temperature0(device, args.dry_run))
        run("temperature1_law", lambda: check_temperature1_law(device, args.dry_run))
        run("seeded_tiny", lambda: check_seeded(device, tiny_ea_model(vocab_size=64, seed=3, aligned=True).to(device),
                                                "tiny", 24))
        run("cycle_7b", lambda: check_cycle_7b(device, big_model(), args.dry_run))
        run("harness_e2e", lambda: check_harness_e2e(device, big_model(), out_dir, args.dry_run))
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
