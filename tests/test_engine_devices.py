"""Device correctness without a GPU (issue 11 item 5).

The model lives on the CPU while torch's default device is ``meta``: any tensor the engine creates
without an explicit device lands on ``meta`` and fails at once (no data), exactly where on a CUDA
machine it would land on the CPU and meet CUDA tensors.
"""
import contextlib

import pytest
import torch

import univer_patch  # noqa: F401  (registers traversal / greedy / univer)
from eagle.model.head import EagleHead
from eagle.testing import tiny_ea_model
from eagle.verify.registry import available_verifiers

IDS = torch.tensor([[1, 2, 3, 4, 5]])
TREES = ["2x5", "mc_sim_7b_63", "chain4"]


@contextlib.contextmanager
def default_device_meta():
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.fixture(scope="module")
def model():
    return tiny_ea_model(vocab_size=32, seed=1, aligned=True)


def _verifiers():
    return [v for v in available_verifiers() if v != "argmax"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("tree", TREES)
def test_eagenerate_places_every_tensor_explicitly(model, tree, temperature):
    for verifier in _verifiers():
        with default_device_meta():
            out, st = model.eagenerate(IDS, temperature=temperature, max_new_tokens=12, tree_choices=tree,
                                       verifier=verifier, seed=0, return_stats=True, expected_tau=True)
        assert out.device.type == "cpu" and st["new_tokens"] == 12, verifier
        ref = model.eagenerate(IDS, temperature=temperature, max_new_tokens=12, tree_choices=tree,
                               verifier=verifier, seed=0)
        assert out.tolist() == ref.tolist(), verifier  # same numbers whatever the default device


@pytest.mark.parametrize("verifier", ["rrsw", "greedy"])
def test_pruned_trees_and_naive_and_tree_laws_on_meta_default(verifier):
    small = tiny_ea_model(vocab_size=3, seed=2)  # mc_sim_7b_63 asks 4 children of the root: pruned
    with default_device_meta():
        out = small.eagenerate([1, 2], temperature=1.0, max_new_tokens=10, tree_choices="mc_sim_7b_63",
                               verifier=verifier, seed=1)
        assert out.device.type == "cpu"
        small.eagenerate([1, 2], temperature=1.0, top_k=2, max_new_tokens=10, tree_choices="2x5",
                         verifier=verifier, seed=1)
        small.eagenerate([1, 2], temperature=0.0, max_new_tokens=10, tree_choices="mc_sim_7b_63")
        small.naivegenerate([1, 2], temperature=1.0, max_new_tokens=5, seed=0)
        laws = small.tree_laws([1, 2, 0], tree_choices="mc_sim_7b_63", temperature=1.0)
    assert laws.target_probs.device.type == "cpu" and laws.parents.numel() < 26


def test_harness_generation_call_on_meta_default(model):
    from evaluation.gen_answer import generate_turns

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    question = {"question_id": 7, "category": "writing", "turns": ["a", "b"]}
    with default_device_meta():
        for method in ["naive", "rrsw", "univer"]:
            choice = generate_turns(model, Tok(), question, method, temperature=1.0, max_new_tokens=6, tree="2x5",
                                    seed=0, prompt_builder=lambda tok, messages: [1, 2, 3, len(messages)])
            assert len(choice["new_tokens"]) == 2


def test_head_keeps_float32_rotary_buffers(tmp_path):
    m = tiny_ea_model(vocab_size=32)
    head = m.ea_layer
    inv = head.rotary_emb.inv_freq.clone()
    assert inv.dtype == torch.float32
    head.to(torch.float16)
    assert head.fc.weight.dtype == torch.float16
    assert head.rotary_emb.inv_freq.dtype == torch.float32 and torch.equal(head.rotary_emb.inv_freq, inv)
    head.half().bfloat16()
    assert torch.equal(head.rotary_emb.inv_freq, inv)
    head.float()
    head.save_pretrained(tmp_path)
    loaded = EagleHead.from_pretrained(tmp_path, embedding=m.base_model.get_input_embeddings(), dtype=torch.float16)
    assert loaded.fc.weight.dtype == torch.float16
    assert loaded.rotary_emb.inv_freq.dtype == torch.float32 and torch.equal(loaded.rotary_emb.inv_freq, inv)


@pytest.mark.parametrize("verifier", ["rrsw", "univer"])
def test_draft_vocabulary_on_meta_default(verifier):
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    m.ea_layer.set_draft_vocab(torch.arange(0, 32, 2))
    with default_device_meta():
        for temperature in (0.0, 1.0):
            out = m.eagenerate(IDS, temperature=temperature, max_new_tokens=10, tree_choices="mc_sim_7b_63",
                               verifier=verifier, seed=0)
            assert out.device.type == "cpu"
