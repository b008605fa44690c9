"""Recall sequences: a derived view of corpus records that trains the head to copy from far back.

Where the default head loses acceptance on Spec-Bench (``research.cycle_losses``; research/head_campaign/head_history.md,
"After stage 8"): 40% of answer positions continue an n-gram already in the context, and inside
long verbatim copies 64 or more tokens back (a second-turn answer that repeats the first one, a
summary quoting the article) stage 8 drafts the next token right only 38% of the time, although the
target copies. The corpus rarely asks for such copies, so the head never learned to look that far.

A recall sequence reuses one corpus record's first turn and adds a second user turn that asks for a
verbatim copy; the "answer" is that copy:

==========  ==========================================================  ===========================
kind        second user turn                                            answer (token ids)
==========  ==========================================================  ===========================
repeat      "Repeat your previous answer word for word." (and variants)  the first answer's own ids
resume      "Repeat your answer from '<first words of a sentence>' on."  the answer from that sentence
quote       "Quote exactly the part of my message that starts with       1-4 sentences of the user's
            '<first words>'."                                             first message
==========  ==========================================================  ===========================

No generation is involved: the features (and the target's soft labels) come from one target forward
over the text, as for every corpus sequence, so where the target would not copy its own logits
say so. Views are deterministic for a given seed. ``python -m eagle.train.features --view recall``
writes their feature shards (one per corpus shard, same split), to be mixed into training with
``--data``.
"""
from __future__ import annotations

import random
import re
from typing import Callable, Sequence

__all__ = ["RECALL_KINDS", "REPEAT_ASKS", "sentence_spans", "recall_record", "recall_records"]

RECALL_KINDS = ("repeat", "resume", "quote")

REPEAT_ASKS = (
    "Repeat your previous answer word for word.",
    "Please write your last answer again, exactly as before.",
    "Copy your answer above without changing anything.",
    "Say that again, unchanged.",
    "I missed that. Could you repeat your answer exactly?",
)

_SENT = re.compile(r"[^.!?\n]+(?:[.!?]+|\n|$)")


def sentence_spans(text: str, min_words: int = 4) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the sentences of ``text`` with at least ``min_words`` words
    (a sentence ends at ``.``, ``!``, ``?`` or a line break; leading spaces are not part of it)."""
    out = []
    for m in _SENT.finditer(text):
        s, e = m.start(), m.end()
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if len(text[s:e].split()) >= min_words:
            out.append((s, e))
    return out


def _lead(text: str, n: int = 5) -> str:
    return " ".join(text.split()[:n])


def recall_record(rec: dict, kind: str, rng: random.Random, encode_chat: Callable[[list], list],
                  encode_text: Callable[[str], list], eos_id: int) -> dict | None:
    """One recall sequence from a corpus record's first turn, in corpus-record form.

    Args:
        rec: corpus record (:mod:`eagle.data.corpus` format) with ``messages`` and ``turns``.
        kind: one of :data:`RECALL_KINDS`.
        rng: the source of the choices (ask wording, sentence picked).
        encode_chat: messages -> chat-template token ids with the generation prompt.
        encode_text: plain text -> token ids (no special tokens).
        eos_id: the end-of-turn token appended to copies that are not the original answer.

    Returns:
        ``{"uid", "kind": "recall-<kind>", "split", "turns": [{"prompt_ids", "answer_ids"}]}``, or
        None when the record offers nothing to copy for this kind (no first exchange, an empty answer,
        too few sentences).

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in RECALL_KINDS:
        raise ValueError(f"recall kind must be one of {RECALL_KINDS}, got {kind!r}")
    msgs, turns = rec.get("messages") or [], rec.get("turns") or []
    if len(msgs) < 2 or not turns:   # no first exchange to copy from
        return None
    user, answer = msgs[0].get("content", ""), msgs[1].get("content", "")
    answer_ids = list(turns[0].get("answer_ids") or [])
    if not answer.strip() or not answer_ids:
        return None
    if kind == "repeat":
        ask, copy = rng.choice(REPEAT_ASKS), answer_ids
    elif kind == "resume":
        spans = sentence_spans(answer)[1:]
        if not spans:
            return None
        s, _ = rng.choice(spans)
        ask = f'Repeat your answer word for word, starting from "{_lead(answer[s:])}".'
        copy = encode_text(answer[s:].rstrip()) + [eos_id]
    else:
        spans = sentence_spans(user)
        if len(spans) < 2:
            return None
        i = rng.randrange(len(spans))
        j = min(len(spans), i + rng.randint(1, 4))
        s, e = spans[i][0], spans[j - 1][1]
        ask = f'Quote exactly the part of my message that starts with "{_lead(user[s:])}", and nothing else.'
        copy = encode_text(user[s:e]) + [eos_id]
    prompt = encode_chat([{"role": "user", "content": user}, {"role": "assistant", "content": answer},
                          {"role": "user", "content": ask}])
    return {"uid": f"{rec.get('uid', '')}#recall-{kind}", "kind": f"recall-{kind}", "split": rec.get("split", "train"),
            "turns": [{"prompt_ids": prompt, "answer_ids": copy}]}


def recall_records(records: Sequence[dict], tok, seed: int, max_len: int) -> list[dict]:
    """One recall sequence per corpus record (kinds in turn, the first that applies), those that fit.

    Args:
        records: corpus records of one shard.
        tok: the target's tokenizer (chat template).
        seed: choices are drawn from ``random.Random(f"{seed}:{uid}")``: the same record always gets
            the same view.
        max_len: sequences longer than this (prompt + copy, tokens) are left out, never cut.

    Returns:
        Corpus-form records (:func:`recall_record`), in input order.
    """
    from eagle.data.corpus import encode_chat as _encode

    def text_ids(s: str) -> list:
        return [int(t) for t in tok.encode(s, add_special_tokens=False)]

    out = []
    for n, rec in enumerate(records):
        rng = random.Random(f"{seed}:{rec.get('uid', n)}")
        first = rng.randrange(len(RECALL_KINDS))
        for k in range(len(RECALL_KINDS)):
            r = recall_record(rec, RECALL_KINDS[(first + k) % len(RECALL_KINDS)], rng, lambda m: _encode(tok, m),
                              text_ids, tok.eos_token_id)
            if r is not None:
                t = r["turns"][0]
                if len(t["prompt_ids"]) + len(t["answer_ids"]) <= max_len:
                    out.append(r)
                break
    return out
