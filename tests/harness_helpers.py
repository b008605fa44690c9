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


def _char_tokenizer():
    """A character-level fast tokenizer (specials + letters, digits, punctuation) with a chat template; its size."""
    import string

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]
    chars = list(string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,?!:\n'-")
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>")),
                                  pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    tok.chat_template = ("{% for m in messages %}<bos>{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<bos>a:{% endif %}")
    return tok, len(vocab)


def tiny_draft_lm_folders(root):
    """Folders (``save_pretrained``) under ``root``: ``target`` (a tiny random Llama, peaked laws, with the
    character tokenizer and its chat template), ``near`` (the target plus noise: a draft model that agrees often)
    and ``far`` (an unrelated 1-layer Llama), all sharing the vocabulary. Returns ``root`` (a Path)."""
    import copy
    from pathlib import Path

    import torch
    from transformers import LlamaForCausalLM

    from eagle.testing import tiny_llama_config

    root = Path(root)
    tok, v = _char_tokenizer()
    torch.manual_seed(0)
    target = LlamaForCausalLM(tiny_llama_config(v, 32, 2)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0 / (target.lm_head.weight.std() * 32 ** 0.5))
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    near = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in near.parameters():
            p.add_(0.3 * p.std() * torch.randn(p.shape, generator=g))
    near.save_pretrained(root / "near")
    torch.manual_seed(7)
    LlamaForCausalLM(tiny_llama_config(v, 32, 1)).save_pretrained(root / "far")
    return root
