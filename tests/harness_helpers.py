"""Shared test helpers for the harness tests (imported as ``harness_helpers``; not a test module)."""
import json

import numpy as np


class _CharTok:
    """Tokenizer stand-in for the tiny model (vocab 32): one id per character, chat roles as markers.

    Records every message list it renders so a test can look at turn 2's prompt.
    """

    def __init__(self):
        self.rendered = []

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        self.rendered.append([dict(m) for m in messages])
        return "".join(f"|{m['role'][0]}|{m['content']}" for m in messages) + ("|a|" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + ord(c) % 31 for c in text[-48:]]}  # keep prompts short for speed

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids)


QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate: bonjour"]},
    {"question_id": 241, "category": "qa", "turns": ["Why is the sky blue?"]},
]


def specbench_speed(jsonl_file, jsonl_file_base, tokenize, task):
    """The computation of Spec-Bench's evaluation/speed.py (``speed()``), restated: filter by task, extend
    ``accept_lengths`` per record, mean tokens/s, baseline tokens by re-tokenising each turn (length - 1)."""
    mt = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]

    def _read(path):
        out = []
        for line in open(path, encoding="utf-8"):
            o = json.loads(line)
            if task == "overall" or (task == "mt_bench" and o["category"] in mt) or o["category"] == task:
                out.append(o)
        return out

    speeds, accept = [], []
    for d in _read(jsonl_file):
        speeds.append(sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]))
        accept.extend(d["choices"][0]["accept_lengths"])
    speeds0 = []
    for d in _read(jsonl_file_base):
        tokens = sum(len(tokenize(t)) - 1 for t in d["choices"][0]["turns"])
        speeds0.append(tokens / sum(d["choices"][0]["wall_time"]))
    return np.array(speeds).mean(), np.array(speeds0).mean(), np.array(speeds).mean() / np.array(speeds0).mean(), \
        np.mean(accept)
