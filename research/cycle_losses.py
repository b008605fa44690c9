"""Where speculative cycles lose tokens, read from an answer file (no model run).

``python -m research.cycle_losses --answers FILE.jsonl[.gz] [--question-file Q] [--model default] [--out DIR]``

An answer file of :mod:`evaluation.gen_answer` holds, per turn, the generated token ids and the
tokens each cycle appended (``accept_lengths``: accepted draft tokens + 1). Cycle ``c`` of a turn
starts after ``j_c = 1 + a_1 + ... + a_{c-1}`` generated tokens (the prefill produced the first),
so the token its depth-1 drafts had to hit is generated token ``j_c``. Per category group this
reports:

* ``tau`` = tokens per cycle (the harness's metric) and ``tau_by_position`` = ``E[a^2] / E[a]``, the
  mean acceptance length seen from a uniformly drawn generated token. The second is what exact tau on
  evenly spread contexts (:mod:`evaluation.exact_tau`) estimates; per-cycle tau is below it whenever
  acceptance varies, because stretches where the head fails take one cycle per token.
* ``p_no_draft`` = P(a cycle accepts no draft token).
* copy positions (:func:`eagle.train.train.lookup_hits`): a cycle start is a copy when the token to
  hit continues a 2-gram already in the context (prompt, earlier turns, answer so far), i.e. when
  prompt lookup would have drafted it. ``copy_share`` = share of cycle starts that are copies;
  ``p_no_draft_copy`` / ``p_no_draft_other`` = P(no draft accepted) at copy / other starts;
  ``copy_share_of_failures`` = share of the no-draft cycles that were copies. A head that copies as
  well as it does on its own held-out text fails far less often at copies than elsewhere.

Only temperature-0 answers say which token the drafts had to hit; at temperature > 0 the numbers
describe the sampled text. Writes ``cycle_losses.json`` and ``cycle_losses.md`` to ``--out``.

``--heads A[,B...]`` also scores draft heads teacher-forced on the answers' own text, exactly as
:mod:`research.heldout` scores them on held-out corpus text (top-1 / top-4 per draft depth, split
into copy and other positions): the target re-reads prompt + answer, and each head is unrolled on its
own features. With temperature-0 answers this is the Spec-Bench counterpart of the held-out table,
so the two show whether a head's accuracy carries over from its training distribution (the answers
are only scored, never trained on). A head with a draft vocabulary (``draft_vocab.safetensors``) is also scored
at depth 1 on the positions whose token is inside / outside it: drafting uses the full vocabulary, but
training's cross-entropy only saw those K rows.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["cycle_records", "summarize_cycles", "render_cycles", "answer_token_records", "score_heads_on_answers",
           "main"]


def cycle_records(record: dict, question: dict, prompt_ids: Callable[[list], list]) -> list[dict]:
    """One entry per cycle of one answer record: ``{"turn", "start", "a", "copy"}``.

    Args:
        record: an answer record (``choices[0]`` with ``turns``, ``new_token_ids``, ``accept_lengths``,
            ``decoding_steps``).
        question: its Spec-Bench question (``turns``).
        prompt_ids: ``messages -> list[int]``, the run's prompt format with its tokenizer.

    Raises:
        ValueError: the record lacks ``choices[0]`` / ``new_token_ids`` / ``accept_lengths`` /
            ``decoding_steps``, an accept length is not an integer >= 1, ``decoding_steps`` do not split the
            cycles over the turns, the question has fewer turns, or a turn's cycles append more (or fewer)
            tokens than it generated.
    """
    from eagle.train.train import lookup_hits
    from evaluation.questions import build_messages

    qid = record.get("question_id")
    choices = record.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"answer {qid}: 'choices' must be a non-empty list of objects")
    c = choices[0]
    for k in ("new_token_ids", "accept_lengths", "decoding_steps", "turns"):
        if k not in c:
            raise ValueError(f"answer {qid}: no {k!r} (written by an older harness?)")
    acc_all, steps_all = c["accept_lengths"], c["decoding_steps"]
    if any(not isinstance(a, int) or isinstance(a, bool) or a < 1 for a in acc_all):
        raise ValueError(f"answer {qid}: accept_lengths must be integers >= 1 (tokens a cycle appended)")
    if len(steps_all) != len(c["new_token_ids"]) or sum(int(x) for x in steps_all) != len(acc_all):
        raise ValueError(f"answer {qid}: decoding_steps {list(steps_all)} do not split its {len(acc_all)} cycles over "
                         f"its {len(c['new_token_ids'])} turns")
    if len(question["turns"]) < len(c["new_token_ids"]):
        raise ValueError(f"answer {qid}: {len(c['new_token_ids'])} turns, its question has {len(question['turns'])}")
    out, first = [], 0
    for turn, (ids, steps) in enumerate(zip(c["new_token_ids"], c["decoding_steps"])):
        acc = c["accept_lengths"][first:first + int(steps)]
        first += int(steps)
        if 1 + sum(acc) < len(ids) or sum(acc) > len(ids):
            raise ValueError(f"answer {record.get('question_id')} turn {turn}: {len(acc)} cycles append {sum(acc)} "
                             f"tokens to a turn of {len(ids)}")
        prompt = list(prompt_ids(build_messages(question["turns"][: turn + 1], c["turns"][:turn])))
        full = torch.tensor(prompt + list(ids), dtype=torch.long)
        hits = lookup_hits(full).tolist()
        j = 1
        for a in acc:
            if j >= len(ids):  # the last cycle's drafts had no token left to hit
                break
            out.append({"turn": turn, "start": j, "a": int(a), "copy": bool(hits[len(prompt) + j - 1])})
            j += int(a)
    return out


def _stats(cyc: Sequence[dict]) -> dict:
    n = len(cyc)
    a = [x["a"] for x in cyc]
    fail = [x for x in cyc if x["a"] == 1]
    cp = [x for x in cyc if x["copy"]]
    other = [x for x in cyc if not x["copy"]]
    frac = lambda num, den: (num / den) if den else None  # noqa: E731
    return {"cycles": n, "tau": frac(sum(a), n), "tau_by_position": frac(sum(x * x for x in a), sum(a)),
            "p_no_draft": frac(len(fail), n), "copy_share": frac(len(cp), n),
            "p_no_draft_copy": frac(sum(x["a"] == 1 for x in cp), len(cp)),
            "p_no_draft_other": frac(sum(x["a"] == 1 for x in other), len(other)),
            "copy_share_of_failures": frac(sum(x["copy"] for x in fail), len(fail))}


def summarize_cycles(per_answer: Sequence[tuple[str, list[dict]]]) -> dict:
    """``{"groups": {group: stats}, "all": stats}`` over ``(category group, cycle_records)`` pairs
    (every cycle counts once; the groups in first-seen order)."""
    groups: dict[str, list] = defaultdict(list)
    for g, cyc in per_answer:
        groups[g].extend(cyc)
    return {"groups": {g: _stats(c) for g, c in groups.items()}, "all": _stats([x for c in groups.values() for x in c])}


def render_cycles(res: dict, source: str = "") -> str:
    """Markdown table of :func:`summarize_cycles`."""
    cols = [("cycles", "{:d}"), ("tau", "{:.2f}"), ("tau_by_position", "{:.2f}"), ("p_no_draft", "{:.3f}"),
            ("copy_share", "{:.3f}"), ("p_no_draft_copy", "{:.3f}"), ("p_no_draft_other", "{:.3f}"),
            ("copy_share_of_failures", "{:.3f}")]
    fmt = lambda f, v: "-" if v is None else f.format(v)  # noqa: E731
    lines = [f"Cycles of {source}" if source else "Cycles", "",
             "| group | " + " | ".join(c for c, _ in cols) + " |", "|---" * (1 + len(cols)) + "|"]
    for g, s in list(res["groups"].items()) + [("all", res["all"])]:
        lines.append(f"| {g} | " + " | ".join(fmt(f, s[c]) for c, f in cols) + " |")
    lines += ["", "tau: tokens per cycle; tau_by_position: E[a^2]/E[a], the acceptance length seen from a uniformly "
              "drawn token; p_no_draft: P(no draft token accepted); copy: the token to hit continues a 2-gram already "
              "in the context (prompt lookup would draft it)."]
    return "\n".join(lines) + "\n"


def answer_token_records(records: Sequence[dict], questions: dict, prompt_ids: Callable[[list], list]) -> list[dict]:
    """Answer records as corpus-format records (``{"turns": [{"prompt_ids", "answer_ids"}]}``, one per
    turn) for :func:`eagle.train.features.build_feature_shard`: each turn's prompt is the run's prompt
    of that turn (earlier turns' answers included), its answer the generated token ids."""
    from evaluation.questions import build_messages

    out = []
    for r in records:
        c, q = r["choices"][0], questions[int(r["question_id"])]
        for turn, ids in enumerate(c["new_token_ids"]):
            p = list(prompt_ids(build_messages(q["turns"][: turn + 1], c["turns"][:turn])))
            out.append({"turns": [{"prompt_ids": p, "answer_ids": list(ids)}]})
    return out


#: copy distance buckets (tokens back to the matched earlier occurrence), [lo, hi)
COPY_DISTANCES = ((1, 16), (16, 64), (64, 256), (256, None))
#: copy run-length buckets (earlier positions of the same verbatim copy), [lo, hi); the last two also
#: split by distance: inside a long copy from far back a drafter that can look back should never miss
COPY_RUNS = ((0, 1, 1), (1, 4, 1), (4, None, 1), (4, None, 64))


def copy_run_lengths(hits: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """How many positions in a row before each one copied from the same place (a verbatim copy run).

    Args:
        hits, dist: :func:`eagle.train.train.lookup_hits` output with ``return_distance`` (``[L]``).

    Returns:
        int64 ``[L]``: 0 where position ``i`` is not a copy or starts a copy; ``r`` when positions
        ``i - r .. i`` are all copies at the same distance (so they continue one earlier passage).
    """
    L = hits.numel()
    idx = torch.arange(L, device=hits.device)
    cont = torch.zeros(L, dtype=torch.bool, device=hits.device)
    if L > 1:
        cont[1:] = hits[1:] & hits[:-1] & (dist[1:] == dist[:-1])
    start = torch.where(cont, torch.zeros_like(idx), idx)      # positions that begin a run (or are no copy)
    return torch.where(hits, idx - torch.cummax(start, 0).values, torch.zeros_like(idx))


def score_heads_on_answers(heads: Sequence[str], token_records: Sequence[dict], base: str = "default",
                           depths: int = 5, max_len: int = 2048, device: str = "cpu",
                           groups: Optional[Sequence[str]] = None) -> dict:
    """Teacher-forced top-1 / top-4 per draft depth of each head on the answers' text, split into copy
    and other positions (:func:`research.heldout.evaluate_heads`).

    Args:
        token_records: :func:`answer_token_records` output (one turn each).
        groups: category group of each token record (optional): adds depth-1 scores per group.

    Returns:
        ``{"sequences", "positions", "heads": {head: {top1_by_depth, top4_by_depth, n_by_depth, copy: {...},
        other: {...}, "by_group": {group: {"copy"|"other": {top1, top4, n}}}, "copy_by_distance":
        [{"lo", "hi", "top1", "top4", "n"}], "copy_by_run": [{"lo", "hi", "min_distance", "top1", "top4",
        "n"}], "draft_vocab": {"k", "inside": {top1, top4, n}, "outside": {...}}}}}``: the last four at draft depth 1
        (``draft_vocab`` only for a head folder with a draft vocabulary: positions whose target top-1, the token
        a draft is scored against, is / is not among its K tokens, the rows its training cross-entropy saw) (``hi`` None = no bound; runs: :func:`copy_run_lengths`,
        :data:`COPY_RUNS`).

    Raises:
        ValueError: ``depths < 2`` (the copy split needs the unrolled evaluation), or ``groups`` of
            another length than ``token_records``.
    """
    from eagle.model.head import EagleHead
    from eagle.train.data import _pad_id, load_base
    from eagle.train.draft_vocab import load_draft_vocab
    from eagle.train.features import build_feature_shard
    from research.heldout import depth_summary, shard_sequences
    from eagle.train.train import evaluate, lookup_hits

    if depths < 2:
        raise ValueError(f"depths must be >= 2, got {depths}")
    if groups is not None and len(groups) != len(token_records):
        raise ValueError(f"groups has {len(groups)} entries for {len(token_records)} token records")
    model, tok = load_base(base, device=device)
    t = build_feature_shard(model, list(token_records), max_len=max_len, batch_tokens=4096, pad_id=_pad_id(tok))
    seqs = shard_sequences(t)
    copy_dist = [lookup_hits(s["ids"], return_distance=True) for s in seqs]
    runs = [copy_run_lengths(c, d) for c, d in copy_dist]
    emb = model.get_input_embeddings()
    w = model.get_output_embeddings().weight.detach().float()

    def depth1(head, keep) -> dict:  # depth-1 scores on the positions where keep[k] (bool [L]) holds
        sub = [{**s, "mask": s["mask"] & k} for s, k in zip(seqs, keep)]
        ev = evaluate(head, w, sub, 2048, depths=2)
        return {"top1": round(ev["acc_by_depth"][0], 4), "top4": round(ev["top4_by_depth"][0], 4),
                "n": ev["n_by_depth"][0]}

    top1_cache: list = []

    def target_top1() -> list:  # row i is scored against the target's top-1 from hidden state i (train.evaluate)
        if not top1_cache:       # the same for every head: computed once
            top1_cache.extend((s["hidden"].to(w) @ w.T).argmax(-1).cpu() for s in seqs)
        return top1_cache

    out = {}
    for h in heads:
        head = EagleHead.from_pretrained(h, embedding=emb).float().to(w.device)
        r = evaluate(head, w, seqs, 2048, depths=depths, split_copy=True)
        rec = depth_summary(r)
        # a head position's row is mask index t + 1, whose flag lookup_hits gives at the same index
        rec["copy_by_distance"] = [
            {"lo": lo, "hi": hi, **depth1(head, [c & (d >= lo) & ((d < hi) if hi else True) for c, d in copy_dist])}
            for lo, hi in COPY_DISTANCES]
        rec["copy_by_run"] = [
            {"lo": lo, "hi": hi, "min_distance": dmin,
             **depth1(head, [c & (r >= lo) & ((r < hi) if hi else True) & (d >= dmin) for (c, d), r in zip(copy_dist, runs)])}
            for lo, hi, dmin in COPY_RUNS]
        d2t = load_draft_vocab(h)
        if d2t is not None:   # positions whose target token the head's training CE could name, and the others
            inside = torch.zeros(w.shape[0], dtype=torch.bool)
            inside[d2t] = True
            nxt = [inside[t] for t in target_top1()]
            rec["draft_vocab"] = {"k": int(d2t.numel()), **{part: depth1(head, [n if part == "inside" else ~n for n in nxt])
                                                         for part in ("inside", "outside")}}
        if groups is not None:
            rec["by_group"] = {g: {part: depth1(head, [(c if part == "copy" else ~c) & torch.tensor(gg == g)
                                                       for (c, _), gg in zip(copy_dist, groups)])
                                   for part in ("copy", "other")} for g in dict.fromkeys(groups)}
        out[h] = rec
    return {"sequences": len(seqs), "positions": int(sum(int(s["mask"][1:].sum()) for s in seqs)), "heads": out}


def _render_heads(sc: dict) -> str:
    lines = ["", f"Heads teacher-forced on the answers' text ({sc['sequences']} turns, {sc['positions']} positions at "
                 f"depth 1): top-1 / top-4 at draft depth d, all positions, copy positions, the others", ""]
    depths = len(next(iter(sc["heads"].values()))["top1_by_depth"])
    lines.append("| head | part | " + " | ".join(f"top-1 d{d}" for d in range(1, depths + 1)) + " | "
                 + " | ".join(f"top-4 d{d}" for d in range(1, depths + 1)) + " | positions d1 |")
    lines.append("|---" * (3 + 2 * depths) + "|")
    for h, r in sc["heads"].items():
        for part, v in (("all", r), ("copy", r["copy"]), ("other", r["other"])):
            lines.append(f"| {h} | {part} | " + " | ".join(f"{x:.3f}" for x in v["top1_by_depth"]) + " | "
                         + " | ".join(f"{x:.3f}" for x in v["top4_by_depth"]) + f" | {v['n_by_depth'][0]} |")
    lines += ["", "Depth 1, copy positions by how far back the copied 2-gram occurred (tokens): top-1 / top-4 (n)", "",
              "| head | " + " | ".join(f"{d['lo']}-{d['hi'] - 1}" if d["hi"] else f"{d['lo']}+"
                                      for d in next(iter(sc["heads"].values()))["copy_by_distance"]) + " |",
              "|---" * (1 + len(COPY_DISTANCES)) + "|"]
    for h, r in sc["heads"].items():
        lines.append(f"| {h} | " + " | ".join(f"{d['top1']:.3f} / {d['top4']:.3f} ({d['n']})"
                                              for d in r["copy_by_distance"]) + " |")
    first = next(iter(sc["heads"].values()))
    if "copy_by_run" in first:
        lines += ["", "Depth 1, copy positions by how many positions before them continued the same copy (run), "
                      "and how far back it reaches: top-1 / top-4 (n)", "",
                  "| head | " + " | ".join(
                      (f"run {d['lo']}-{d['hi'] - 1}" if d["hi"] else f"run {d['lo']}+")
                      + (f", {d['min_distance']}+ back" if d["min_distance"] > 1 else "") for d in first["copy_by_run"])
                  + " |", "|---" * (1 + len(first["copy_by_run"])) + "|"]
        for h, r in sc["heads"].items():
            lines.append(f"| {h} | " + " | ".join(f"{d['top1']:.3f} / {d['top4']:.3f} ({d['n']})"
                                                  for d in r["copy_by_run"]) + " |")
    if "draft_vocab" in first:
        lines += ["", "Depth 1, positions whose token is inside / outside the head's draft vocabulary (the lm_head rows "
                      "its training cross-entropy used): top-1 / top-4 (n)", "",
                  "| head | K | inside | outside |", "|---|---|---|---|"]
        for h, r in sc["heads"].items():
            if "draft_vocab" in r:
                v = r["draft_vocab"]
                lines.append(f"| {h} | {v['k']} | " + " | ".join(
                    f"{v[p]['top1']:.3f} / {v[p]['top4']:.3f} ({v[p]['n']})" for p in ("inside", "outside")) + " |")
    if "by_group" in first:
        lines += ["", "Depth 1 per category group: top-1 at copy / other positions (n copy / n other)", "",
                  "| head | " + " | ".join(first["by_group"]) + " |", "|---" * (1 + len(first["by_group"])) + "|"]
        for h, r in sc["heads"].items():
            lines.append(f"| {h} | " + " | ".join(
                f"{v['copy']['top1']:.3f} / {v['other']['top1']:.3f} ({v['copy']['n']} / {v['other']['n']})"
                for v in r["by_group"].values()) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Command-line entry point; prints the table, writes JSON + markdown, returns the result."""
    from evaluation.questions import category_group

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", required=True, help="answer file (.jsonl or .jsonl.gz) of a speculative method")
    ap.add_argument("--question-file", default="../shared/specbench/question.jsonl")
    ap.add_argument("--model", default="", help="tokenizer source (default: the answers' model; 'default' = the "
                                                "embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--out", default="", help="folder for cycle_losses.json / .md (default: print only)")
    ap.add_argument("--heads", default="", help="comma-separated head folders to score teacher-forced on the answers' "
                                                "text (loads the target; default: none)")
    ap.add_argument("--base", default="default", help="target for --heads (HF folder / hub id, or 'default')")
    ap.add_argument("--depths", type=int, default=5, help="draft depths for --heads (>= 2)")
    ap.add_argument("--max-len", type=int, default=2048, help="tokens per turn (prompt + answer) for --heads")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    heads = [h for h in args.heads.split(",") if h]
    for h in heads:
        if not (Path(h) / "config.json").is_file():
            ap.error(f"--heads: {h} has no config.json")
    if args.depths < 2 or args.max_len < 3:
        ap.error("--depths must be >= 2 and --max-len >= 3")
    ans, qf = Path(args.answers), Path(args.question_file)
    if not ans.is_file():
        ap.error(f"--answers: no file {ans}")
    if not qf.is_file():
        ap.error(f"--question-file: no file {qf}")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out: {args.out} exists and is not a folder")
    from evaluation.questions import load_questions
    from evaluation.speed import load_answers
    from evaluation.templates import PromptFormat

    try:
        recs = load_answers(str(ans))
    except ValueError as e:
        ap.error(f"--answers: {str(e).splitlines()[0]}")
    if not recs:
        ap.error(f"--answers: {ans} holds no answers")
    try:
        qids = [int(r["question_id"]) for r in recs]
    except (KeyError, TypeError, ValueError):
        ap.error(f"--answers: {ans} has an answer without an integer question_id")
    if len(set(qids)) != len(qids):
        ap.error(f"--answers: {ans} holds question {next(q for q in qids if qids.count(q) > 1)} more than once")
    for key in ("method", "temperature", "tree", "prompt_format", "model", "head"):
        values = {json.dumps(r.get(key), sort_keys=True) for r in recs}
        if len(values) > 1:
            ap.error(f"--answers: {ans} mixes answers of different runs ({key}: {sorted(values)[:3]})")
    if recs[0].get("method") == "naive":
        ap.error(f"--answers: {ans} is plain decoding (one token per step); pass a speculative method's answers")
    fmt_rec = recs[0].get("prompt_format")
    if not isinstance(fmt_rec, dict) or "name" not in fmt_rec:
        ap.error(f"--answers: {ans} does not record its prompt_format (written by an older harness)")
    try:
        questions = {int(q["question_id"]): q for q in load_questions(qf)}
    except (ValueError, TypeError) as e:
        ap.error(f"--question-file: {str(e).splitlines()[0]}")
    missing = [q for q in qids if q not in questions]
    if missing:
        ap.error(f"--question-file: {qf} lacks questions {missing[:5]} of the answers")
    model = args.model or recs[0].get("model", "default")
    try:
        if model == "default":
            from eagle.model.default import default_base_folder

            model = str(default_base_folder())
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError, ModuleNotFoundError) as e:
        ap.error(f"--model: cannot load the tokenizer of {model!r}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    fmt = PromptFormat(fmt_rec["name"], fmt_rec.get("source", ""), fmt_rec.get("reason", ""))
    per = []
    for r in recs:
        q = questions[int(r["question_id"])]
        try:
            per.append((category_group(q["category"]), cycle_records(r, q, lambda m: fmt.ids(tok, m))))
        except ValueError as e:
            ap.error(f"--answers: {e}")
    res = summarize_cycles(per)
    res.update(answers=str(ans), temperature=recs[0].get("temperature"), method=recs[0].get("method"),
               tree=recs[0].get("tree"), head=recs[0].get("head"), n_answers=len(recs))
    md = render_cycles(res, f"{ans.name} ({len(recs)} answers)")
    if heads:
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        groups = [category_group(questions[int(r["question_id"])]["category"])
                  for r in recs for _ in r["choices"][0]["new_token_ids"]]  # one per turn, as the token records
        res["heads_on_answers"] = score_heads_on_answers(
            heads, answer_token_records(recs, questions, lambda m: fmt.ids(tok, m)), base=args.base, depths=args.depths,
            max_len=args.max_len, groups=groups)
        md += _render_heads(res["heads_on_answers"])
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cycle_losses.json").write_text(json.dumps(res, indent=1))
        (out / "cycle_losses.md").write_text(md)
        print(f"wrote {out / 'cycle_losses.json'} and {out / 'cycle_losses.md'}")
    return res


if __name__ == "__main__":
    main()
