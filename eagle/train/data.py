"""Training data for an EAGLE-1 head: the target's own responses and its last hidden states.

``python -m eagle.train.data --base BASE --out DIR [...]``

Pipeline
--------
1. Prompts: Alpaca records (``instruction``/``input``/``output``; default
   ``/work/shared/prompts/alpaca_5000.json``, CC BY-NC 4.0, research use), deduplicated against
   every Spec-Bench turn (:func:`dedupe_against_specbench`).
2. The prompts are shuffled with ``--seed`` and split into shards of ``--shard-size`` prompts.
   The first ``--n-gen`` prompts are *generated* shards: the target answers with its chat
   template (batched ``generate`` with left padding), greedily, except every
   ``--sample-every``-th generated shard, which samples at ``--temperature`` (self-distillation;
   temperature 0 is what the greedy evaluation sees, the sampled fraction covers tau at T > 0).
   The next ``--n-fixed`` prompts are *fixed* shards: Alpaca's own reference answer is the
   response (cheap: one forward pass, no generation). Shards are interleaved
   (``--fixed-per-gen`` fixed shards, then one generated shard) so that a run cut by
   ``--max-minutes`` holds both kinds.
3. The target runs once over prompt + response (right padding) and its last hidden state after the
   final norm is stored.

Shard format (``shard_00000.safetensors``, sequences packed back to back, ``T`` = total tokens)::

    input_ids  int32   [T]      chat-template prompt + response token ids
    loss_mask  uint8   [T]      1 on response tokens (including the closing EOS), 0 on the prompt
    hidden     float16 [T, H]   target last hidden state after the final norm at each token
    offsets    int64   [S + 1]  sequence s is tokens offsets[s]:offsets[s+1]

plus ``shard_00000.json`` (kind, prompt ids, token counts, seconds). A shard is written to a
temporary name and renamed, so a killed run leaves only complete shards; a rerun skips them
(resumable). Output is deterministic for a given ``--seed`` and arguments (batched CPU kernels).

Parallel and incremental runs: ``--worker I/N`` builds only the plan shards whose index is I mod N,
so N one-thread processes can fill one folder together; ``--exclude-gen-of DIR`` drops the prompts
that DIR's plan answers with the target itself, so a second folder (another ``--seed``) adds new
self-distilled prompts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import random
import time
from pathlib import Path

import torch

from eagle.data.corpus import DEFAULT_PROMPTS, DEFAULT_SPECBENCH, SHARED, load_alpaca  # noqa: F401  (re-exported)

__all__ = ["load_alpaca", "normalise", "dedupe_against_specbench", "plan_shards", "build_shard",
           "shard_paths", "load_shards", "FeatureRows", "feature_rows", "load_base", "DTYPES", "add_fast_cpu_argument", "add_device_argument", "parse_device",
           "parse_worker", "main"]


# ---------------------------------------------------------------------------------------- prompts
def normalise(text: str) -> str:
    """Lower case, punctuation to spaces, whitespace collapsed (for duplicate detection)."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def dedupe_against_specbench(records: list[dict], specbench_path: str | os.PathLike = DEFAULT_SPECBENCH,
                             ngram: int = 8, min_words: int = 5) -> tuple[list[dict], dict]:
    """Drop every record that overlaps any Spec-Bench turn.

    A record (its prompt and its reference output, each normalised with :func:`normalise`) is
    dropped when it equals a turn, contains a turn, is contained in a turn, or shares a word
    ``ngram``-gram with a turn. Containment is on word boundaries and only for a contained side
    of at least ``min_words`` words (otherwise a one-word answer such as "no" would be "contained"
    in every long article; exact equality always counts).

    Returns:
        (kept records, stats dict with ``before``, ``after``, ``dropped_exact_or_contained``,
        ``dropped_ngram``, ``ngram``, ``specbench_turns``).
    """
    turns = []
    with open(specbench_path) as f:
        for line in f:
            if line.strip():
                turns.extend(json.loads(line)["turns"])
    nturns = [normalise(t) for t in turns]
    nturns = [t for t in nturns if t]
    grams: set = set()
    for t in nturns:
        grams |= _ngrams(t.split(), ngram)
    padded = [f" {t} " for t in nturns]
    exact = set(nturns)
    kept, n_contained, n_gram = [], 0, 0
    for r in records:
        fields = [normalise(r["prompt"]), normalise(r.get("output", ""))]
        contained = False
        for fld in fields:
            if not fld:
                continue
            pf = f" {fld} "
            long_fld = len(fld.split()) >= min_words
            if (fld in exact or (long_fld and any(pf in t for t in padded))
                    or any(len(t.split()) >= min_words and t in pf for t in padded)):
                contained = True
                break
        if contained:
            n_contained += 1
            continue
        if any(_ngrams(fld.split(), ngram) & grams for fld in fields):
            n_gram += 1
            continue
        kept.append(r)
    stats = {"before": len(records), "after": len(kept), "dropped_exact_or_contained": n_contained,
             "dropped_ngram": n_gram, "ngram": ngram, "min_words": min_words, "specbench_turns": len(turns)}
    return kept, stats


def plan_shards(records: list[dict], n_gen: int, n_fixed: int, shard_size: int, seed: int,
                sample_every: int = 0, fixed_shard_size: int | None = None,
                fixed_per_gen: int = 0) -> list[dict]:
    """Deterministic shard plan: ``[{"index", "kind" in {"fixed","greedy","sample"}, "records"}]``.

    The records are shuffled with ``seed``; the first ``n_gen`` become generated shards (every
    ``sample_every``-th generated shard samples, 0 = none), the next ``n_fixed`` fixed shards.
    ``fixed_per_gen`` = 0: all fixed shards first (they are cheap), then the generated ones;
    k > 0: interleaved, k fixed shards then one generated shard, so a run stopped by its time
    budget still holds both kinds.
    """
    recs = list(records)
    random.Random(seed).shuffle(recs)
    gen, fixed = recs[:n_gen], recs[n_gen:n_gen + n_fixed]
    fs = fixed_shard_size or shard_size
    fixed_shards = [{"kind": "fixed", "records": fixed[i:i + fs]} for i in range(0, len(fixed), fs)]
    gen_shards = []
    for j, i in enumerate(range(0, len(gen), shard_size)):
        kind = "sample" if sample_every and j % sample_every == sample_every - 1 else "greedy"
        gen_shards.append({"kind": kind, "records": gen[i:i + shard_size]})
    if fixed_per_gen <= 0:
        plan = fixed_shards + gen_shards
    else:  # interleave: fixed_per_gen fixed shards, then one generated shard, ...
        plan = []
        while fixed_shards or gen_shards:
            plan += fixed_shards[:fixed_per_gen] + gen_shards[:1]
            fixed_shards, gen_shards = fixed_shards[fixed_per_gen:], gen_shards[1:]
    for k, p in enumerate(plan):
        p["index"] = k
    return plan


# ---------------------------------------------------------------------------------------- target
def load_base(base: str, fast_cpu: bool = False, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model in eval mode on ``device``, tokenizer) for a HF causal-LM path / hub id, or ``"default"``.

    ``fast_cpu``: on the CPU, swap the linears for oneDNN pre-packed ones
    (:mod:`eagle.model.packed_linear`; logits within 1e-4, measured here ~1.75-1.8x the tokens/s of
    batched generation and of feature recompute); :func:`linears_of` says which kernels a model runs.
    ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``; :func:`parse_device` checks a CLI value) and
    ``dtype`` (float32 by default; features are stored as float16 either way) place the weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if base == "default":
        from eagle.model.default import default_base_folder

        base = str(default_base_folder())
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device).eval()
    if fast_cpu and next(model.parameters()).device.type == "cpu" and dtype == torch.float32:
        from eagle.model.packed_linear import pack_linears

        pack_linears(model)
    return model, tok


def linears_of(model) -> str:
    """``"onednn-packed"`` when :func:`load_base` packed the model's linears, else ``"eager"`` (recorded
    with generated data and features)."""
    from eagle.model.packed_linear import PackedLinear

    return "onednn-packed" if any(isinstance(m, PackedLinear) for m in model.modules()) else "eager"


def _prompt_ids(tok, prompt: str) -> list[int]:
    if getattr(tok, "chat_template", None):
        enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True)
        if not isinstance(enc, list):
            enc = enc["input_ids"]
        return list(enc)
    return tok(prompt + "\n", add_special_tokens=True)["input_ids"]


def _pad_id(tok) -> int:
    if tok.pad_token_id is not None:
        return tok.pad_token_id
    return tok.eos_token_id if tok.eos_token_id is not None else 0


@torch.no_grad()
def _generate(model, tok, prompts: list[list[int]], max_new: int, sample: bool, temperature: float,
              seed: int) -> list[list[int]]:
    """Batched generation (left padding). Returns each response up to and including the first EOS."""
    pad = _pad_id(tok)
    eos = tok.eos_token_id
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad, dtype=torch.long)
    att = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        att[i, L - len(p):] = 1
    kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator
    dev = next(model.parameters()).device
    out = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new, pad_token_id=pad,
                         eos_token_id=eos, **kw)
    res = []
    for row in out[:, L:].tolist():
        if eos is not None and eos in row:
            row = row[:row.index(eos) + 1]
        res.append(row)
    return res


@torch.no_grad()
def _hidden(model, seqs: list[list[int]], pad: int) -> list[torch.Tensor]:
    """Last hidden state after the final norm, ``[len(seq), H]`` per sequence (right padding), in the
    model's dtype on the model's device."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = 1
    dev = next(model.parameters()).device
    h = model.get_decoder()(input_ids=ids.to(dev), attention_mask=att.to(dev)).last_hidden_state
    return [h[i, :len(s)] for i, s in enumerate(seqs)]


def build_shard(model, tok, shard: dict, *, max_new: int, max_len: int, gen_batch: int, fwd_tokens: int,
                temperature: float, seed: int) -> tuple[dict, dict]:
    """Run one planned shard. Returns (tensors as in the module docstring, metadata)."""
    t0 = time.time()
    recs = shard["records"]
    prompts = [_prompt_ids(tok, r["prompt"])[: max_len - 8] for r in recs]
    if shard["kind"] == "fixed":
        eos = tok.eos_token_id
        responses = [tok(r["output"], add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
                     for r in recs]
    else:
        order = sorted(range(len(recs)), key=lambda i: len(prompts[i]))
        responses = [None] * len(recs)
        for b in range(0, len(order), gen_batch):
            idx = order[b:b + gen_batch]
            outs = _generate(model, tok, [prompts[i] for i in idx], max_new, shard["kind"] == "sample",
                             temperature, seed * 100003 + shard["index"] * 101 + b)
            for i, o in zip(idx, outs):
                responses[i] = o
    t_gen = time.time() - t0
    seqs, masks = [], []
    for p, r in zip(prompts, responses):
        s = (p + r)[:max_len]
        seqs.append(s)
        masks.append([0] * len(p) + [1] * (len(s) - len(p)))
    # forward in length-sorted groups of about fwd_tokens padded tokens
    pad = _pad_id(tok)
    hidden: list = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j + 1 - i) * len(seqs[order[j]]) <= fwd_tokens:
            j += 1
        grp = order[i:j]
        for k, h in zip(grp, _hidden(model, [seqs[k] for k in grp], pad)):
            hidden[k] = h.to("cpu", torch.float16)
        i = j
    offsets = [0]
    for s in seqs:
        offsets.append(offsets[-1] + len(s))
    tensors = {
        "input_ids": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
        "loss_mask": torch.tensor([m for ms in masks for m in ms], dtype=torch.uint8),
        "hidden": torch.cat(hidden, 0).contiguous(),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
    }
    meta = {"index": shard["index"], "kind": shard["kind"], "ids": [r["id"] for r in recs],
            "sequences": len(seqs), "tokens": offsets[-1], "response_tokens": int(tensors["loss_mask"].sum()),
            "ended_with_eos": sum(1 for r in responses if r and r[-1] == tok.eos_token_id),
            "seconds_generate": round(t_gen, 2), "seconds": round(time.time() - t0, 2)}
    return tensors, meta


def shard_paths(folder: str | os.PathLike) -> list[Path]:
    """The complete shard files of ``folder`` (``shard_*.safetensors``; unfinished ``.tmp`` files excluded), in index order."""
    return sorted(Path(folder).glob("shard_*.safetensors"))


def load_shards(folder: str | os.PathLike) -> list[dict]:
    """All complete shards of ``folder`` as dicts of tensors (see the module docstring), in index order."""
    from safetensors.torch import load_file

    return [load_file(str(p)) for p in shard_paths(folder)]


#: safetensors dtype names -> torch dtypes (the ones feature shards use)
_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


class FeatureRows:
    """Rows ``start:stop`` of a 2-D tensor in a safetensors file, read from disk each time they are asked for.

    The rows are read with ``os.pread`` (not a memory map), so the training process holds only the rows of
    the batch it is collating: its resident set does not grow with the feature cache (3.4M tokens of
    float16 features at H = 576 are 3.9 GB; the kernel's page cache, which is not the process's RSS, keeps
    the hot file parts). Duck-types the few tensor uses a sequence's ``"hidden"`` gets: ``shape``,
    ``len``, ``float()``, ``to(...)``, indexing (each returns a fresh tensor).

    Args:
        path: a feature shard (``shard_*.safetensors``, :func:`shard_paths`).
        offset: byte offset of the tensor's row 0 in the file; ``row_bytes``: bytes per row;
        cols: ``H``; dtype: the stored dtype; start / stop: the row range (``0 <= start <= stop``).
    """

    __slots__ = ("path", "offset", "row_bytes", "cols", "dtype", "start", "stop")

    def __init__(self, path: str, offset: int, row_bytes: int, cols: int, dtype: torch.dtype, start: int, stop: int):
        self.path, self.offset, self.row_bytes, self.cols = path, offset, row_bytes, cols
        self.dtype, self.start, self.stop = dtype, start, stop

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.stop - self.start, self.cols))

    def __len__(self) -> int:
        return self.stop - self.start

    def load(self) -> torch.Tensor:
        """The rows as a new tensor ``[stop - start, cols]`` of the stored dtype.

        Raises:
            OSError: the file is gone or shorter than its header says (the cache changed under the run).
        """
        n = (self.stop - self.start) * self.row_bytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            buf = bytearray(n)
            got = os.preadv(fd, [buf], self.offset + self.start * self.row_bytes) if n else 0
        finally:
            os.close(fd)
        if got != n:
            raise OSError(f"{self.path}: read {got} of {n} bytes of feature rows {self.start}:{self.stop}; "
                          "the feature shard changed or was cut short (recompute it)")
        return torch.frombuffer(buf, dtype=self.dtype).view(self.stop - self.start, self.cols) if n else \
            torch.zeros(0, self.cols, dtype=self.dtype)

    def float(self) -> torch.Tensor:
        return self.load().float()

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.load().to(*args, **kwargs)

    def __getitem__(self, idx) -> torch.Tensor:
        return self.load()[idx]

    def rows(self, start: int, stop: int) -> "FeatureRows":
        """The sub-range ``start:stop`` (relative to this range, clipped to it) as another lazy range."""
        a = self.start + max(0, min(start, len(self)))
        return FeatureRows(self.path, self.offset, self.row_bytes, self.cols, self.dtype, a,
                           max(a, self.start + max(0, min(stop, len(self)))))


def feature_rows(path: str | os.PathLike, name: str = "hidden") -> FeatureRows:
    """All rows of the 2-D tensor ``name`` of a safetensors file as a :class:`FeatureRows` (nothing read
    but the header).

    Raises:
        ValueError: not a safetensors file, no tensor ``name``, not 2-D, or a dtype other than F16 / BF16 / F32.
    """
    path = str(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            if not 0 < n < 100_000_000:
                raise ValueError("bad header length")
            header = json.loads(f.read(n))
            info = header[name]
            dtype = _ST_DTYPES[info["dtype"]]
            rows, cols = info["shape"]
            lo, hi = info["data_offsets"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: no readable 2-D F16/BF16/F32 tensor {name!r} in a safetensors header ({e})") from None
    row_bytes = cols * torch.empty(0, dtype=dtype).element_size()
    if hi - lo != rows * row_bytes:
        raise ValueError(f"{path}: tensor {name!r} spans {hi - lo} bytes, expected {rows} x {row_bytes}")
    return FeatureRows(path, 8 + n + lo, row_bytes, cols, dtype, 0, rows)


# ---------------------------------------------------------------------------------------- CLI
def add_fast_cpu_argument(ap: argparse.ArgumentParser) -> None:
    """``--fast-cpu on|off`` (default on): :func:`load_base`'s ``fast_cpu``."""
    ap.add_argument("--fast-cpu", choices=("on", "off"), default="on",
                    help="oneDNN pre-packed float32 linears on the CPU (eagle.model.packed_linear): ~1.75x the "
                         "tokens/s here, logits within 1e-4 of eager (default on)")


#: ``--dtype`` names -> torch dtypes (target weights for generation / feature recompute)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_device_argument(ap: argparse.ArgumentParser, dtype: bool = False) -> None:
    """``--device auto|cpu|cuda|cuda:N`` (default auto: CUDA when present; :func:`parse_device` checks
    it) and, with ``dtype``, ``--dtype float32|bfloat16|float16`` for the target's weights."""
    ap.add_argument("--device", default="auto",
                    help="auto (cuda when available, else cpu) | cpu | cuda | cuda:N")
    if dtype:
        ap.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="target weights (default float32; float16 / bfloat16 for large targets on a GPU)")


def parse_device(ap: argparse.ArgumentParser, spec: str) -> str:
    """``--device`` value -> ``"cpu"`` or ``"cuda:N"``; a malformed value or a CUDA device that is not
    there exits through ``ap.error`` (one line naming ``--device``) before any work starts."""
    from eagle.model.device import device_problem

    why = device_problem(spec)
    if why:
        ap.error(f"--device: {why}")
    if spec == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    return "cpu" if spec == "cpu" else f"cuda:{int(spec.split(':')[1]) if ':' in spec else 0}"


def parse_worker(ap: argparse.ArgumentParser, spec: str) -> tuple[int, int]:
    """``--worker I/N`` -> ``(I, N)`` with ``0 <= I < N``; otherwise exits through ``ap.error``."""
    try:
        worker, n_workers = (int(x) for x in spec.split("/"))
        if not 0 <= worker < n_workers:
            raise ValueError
    except ValueError:
        ap.error(f"--worker must be I/N with 0 <= I < N, got {spec!r}")
    return worker, n_workers


def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point; returns the run summary (also written to ``DIR/summary.json``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="default", help='HF causal LM path / hub id, or "default"')
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ap.add_argument("--specbench", default=DEFAULT_SPECBENCH)
    ap.add_argument("--ngram", type=int, default=8)
    ap.add_argument("--n-gen", type=int, default=1024, help="prompts answered by the target itself")
    ap.add_argument("--n-fixed", type=int, default=100000, help="prompts with Alpaca's reference answer")
    ap.add_argument("--shard-size", type=int, default=64)
    ap.add_argument("--fixed-shard-size", type=int, default=512)
    ap.add_argument("--fixed-per-gen", type=int, default=4, help="interleave k fixed shards per generated one")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--fwd-tokens", type=int, default=4096, help="padded tokens per hidden-state forward")
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--sample-every", type=int, default=5, help="every k-th generated shard samples (0: none)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kinds", default="fixed,greedy,sample",
                    help="build only shards of these kinds now (the plan is unchanged; a later run fills the rest)")
    ap.add_argument("--first-shards", type=int, default=0,
                    help="build only shards whose plan index is below this (0: all)")
    ap.add_argument("--max-minutes", type=float, default=0.0, help="start no new shard after this (0: no limit)")
    ap.add_argument("--worker", default="0/1",
                    help="I/N: build only shards whose plan index is I mod N, so N processes (one thread each) "
                         "can fill one folder in parallel")
    ap.add_argument("--exclude-gen-of", default="",
                    help="folder of an earlier run: leave out the prompts its plan answers with the target itself "
                         "(so a second folder adds new self-distilled prompts)")
    args = ap.parse_args(argv)
    worker, n_workers = parse_worker(ap, args.worker)

    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    records = load_alpaca(args.prompts)
    kept, stats = dedupe_against_specbench(records, args.specbench, args.ngram)
    if args.exclude_gen_of:
        plans = sorted(Path(args.exclude_gen_of).glob("plan*.json"))  # plan.json or plan.workerI.json
        if not plans:
            raise FileNotFoundError(f"--exclude-gen-of {args.exclude_gen_of}: no plan.json from eagle.train.data there")
        with open(plans[0]) as f:
            other = json.load(f)["args"]
        earlier = [r for p in plan_shards(kept, other["n_gen"], 0, other["shard_size"], other["seed"])
                   for r in p["records"]]
        used = {r["id"] for r in earlier}
        kept = [r for r in kept if r["id"] not in used]
        stats["excluded_gen_of_earlier_run"] = len(used)
    plan = plan_shards(kept, args.n_gen, args.n_fixed, args.shard_size, args.seed, args.sample_every,
                       args.fixed_shard_size, args.fixed_per_gen)
    model, tok = load_base(args.base)
    plan_name = "plan.json" if n_workers == 1 else f"plan.worker{worker}.json"
    with open(out / plan_name, "w") as f:
        json.dump({"args": vars(args), "dedupe": stats,
                   "shards": [{"index": p["index"], "kind": p["kind"], "n": len(p["records"])} for p in plan]},
                  f, indent=1)
    kinds = set(args.kinds.split(","))
    done = skipped = 0
    bar = tqdm(plan, desc="shards", unit="shard")
    for shard in bar:
        name = out / f"shard_{shard['index']:05d}"
        if name.with_suffix(".safetensors").exists() and name.with_suffix(".json").exists():
            skipped += 1
            continue
        if shard["kind"] not in kinds or (args.first_shards and shard["index"] >= args.first_shards):
            continue
        if shard["index"] % n_workers != worker:
            continue
        if args.max_minutes and time.time() - t_start > args.max_minutes * 60:
            bar.write(f"time budget of {args.max_minutes} min reached; stopping before shard {shard['index']}")
            break
        tensors, meta = build_shard(model, tok, shard, max_new=args.max_new, max_len=args.max_len,
                                    gen_batch=args.gen_batch, fwd_tokens=args.fwd_tokens,
                                    temperature=args.temperature, seed=args.seed)
        from safetensors.torch import save_file

        tmp = name.with_suffix(".safetensors.tmp")
        save_file(tensors, str(tmp))
        with open(name.with_suffix(".json.tmp"), "w") as f:
            json.dump(meta, f)
        os.replace(tmp, name.with_suffix(".safetensors"))
        os.replace(name.with_suffix(".json.tmp"), name.with_suffix(".json"))
        done += 1
        bar.set_postfix(kind=meta["kind"], tok=meta["tokens"],
                        tok_s=round(meta["response_tokens"] / max(meta["seconds"], 1e-9), 1))
    metas = [json.load(open(p)) for p in sorted(out.glob("shard_*.json"))]
    summary = {"dedupe": stats, "shards_written_now": done, "shards_skipped": skipped,
               "shards_total": len(metas), "planned": len(plan),
               "sequences": sum(m["sequences"] for m in metas), "tokens": sum(m["tokens"] for m in metas),
               "response_tokens": sum(m["response_tokens"] for m in metas),
               "by_kind": {k: {"sequences": sum(m["sequences"] for m in metas if m["kind"] == k),
                               "response_tokens": sum(m["response_tokens"] for m in metas if m["kind"] == k),
                               "seconds": round(sum(m["seconds"] for m in metas if m["kind"] == k), 1)}
                           for k in ("fixed", "greedy", "sample")},
               "wall_seconds_this_run": round(time.time() - t_start, 1)}
    with open(out / "summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
