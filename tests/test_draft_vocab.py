"""Draft vocabulary (FR-Spec style): building the map, loading it with a head, and losslessness.

The draft law lives on K of the V target tokens and is zero elsewhere; temperature 0 must still
equal greedy decoding token for token, and at temperature 1 the first two generated tokens must
still follow the target's exact law (same chi-square test as tests/test_e2e_law.py), for every
verifier, with a draft vocabulary that leaves out tokens the target likes.
"""
import pytest
import torch

from eagle.model.head import DRAFT_VOCAB_FILE, CheckpointMismatchError, EagleHead
from eagle.testing import tiny_ea_model
from eagle.train.draft_vocab import count_tokens, load_draft_vocab, save_draft_vocab, top_k_vocab

from test_e2e_law import N_RUNS, P_MIN, PROMPT, V, empirical, exact_two_token_law, model as law_model, p_value


# ------------------------------------------------------------------ building the map
def test_count_and_top_k():
    counts = count_tokens([[1, 2, 2, 3], [3, 3, 5], []], 8)
    assert counts.tolist() == [0, 1, 2, 3, 0, 1, 0, 0]
    assert top_k_vocab(counts, 2).tolist() == [2, 3]
    assert top_k_vocab(counts, 3).tolist() == [1, 2, 3]  # tie 1 vs 5: smaller id first
    assert top_k_vocab(counts, 2, always=[7]).tolist() == [3, 7]  # EOS forced in, K kept
    assert top_k_vocab(counts, 100).tolist() == [1, 2, 3, 5]  # unseen tokens left out
    with pytest.raises(ValueError, match="vocabulary"):
        count_tokens([[8]], 8)
    with pytest.raises(ValueError, match="k must"):
        top_k_vocab(counts, 0)
    with pytest.raises(ValueError, match="outside"):
        top_k_vocab(counts, 2, always=[9])


def test_save_load_roundtrip(tmp_path):
    assert load_draft_vocab(tmp_path) is None
    save_draft_vocab(tmp_path, torch.tensor([0, 4, 9]), {"k": 3, "sources": [{"x": 1}]})
    assert load_draft_vocab(tmp_path).tolist() == [0, 4, 9]
    with pytest.raises(ValueError, match="increasing"):
        save_draft_vocab(tmp_path, torch.tensor([4, 4]))


# ------------------------------------------------------------------ head loader
def _saved_head(tmp_path):
    m = tiny_ea_model(vocab_size=32, seed=0)
    m.ea_layer.save_pretrained(tmp_path)
    return m


def test_head_without_map_loads_unchanged(tmp_path):
    m = _saved_head(tmp_path)
    head = EagleHead.from_pretrained(tmp_path, embedding=m.base_model.get_input_embeddings())
    assert head.d2t is None
    assert "d2t" not in head.state_dict()


def test_head_loads_the_map_and_keeps_it_out_of_the_checkpoint(tmp_path):
    m = _saved_head(tmp_path)
    save_draft_vocab(tmp_path, torch.arange(0, 32, 2))
    head = EagleHead.from_pretrained(tmp_path, embedding=m.base_model.get_input_embeddings())
    assert head.d2t.tolist() == list(range(0, 32, 2))
    assert "d2t" not in head.state_dict()
    head.save_pretrained(tmp_path / "again")  # the map is not written into the weights
    assert not (tmp_path / "again" / DRAFT_VOCAB_FILE).exists()
    assert EagleHead.from_pretrained(tmp_path, embedding=m.base_model.get_input_embeddings(),
                                     draft_vocab=False).d2t is None


@pytest.mark.parametrize("bad", [torch.tensor([3, 1]), torch.tensor([0, 32]), torch.tensor([-1, 2])])
def test_head_refuses_a_bad_map(tmp_path, bad):
    m = _saved_head(tmp_path)
    from safetensors.torch import save_file

    save_file({"d2t": bad}, str(tmp_path / DRAFT_VOCAB_FILE))
    with pytest.raises(CheckpointMismatchError, match="d2t"):
        EagleHead.from_pretrained(tmp_path, embedding=m.base_model.get_input_embeddings())


def test_set_draft_vocab_checks():
    head = tiny_ea_model(vocab_size=16).ea_layer
    for bad in (torch.tensor([]), torch.tensor([[1, 2]]), torch.tensor([0.0, 1.0]), torch.tensor([2, 2])):
        with pytest.raises(ValueError, match="d2t"):
            head.set_draft_vocab(bad)
    head.set_draft_vocab([1, 5])
    assert head.d2t.dtype == torch.long
    head.set_draft_vocab(None)
    assert head.d2t is None


# ------------------------------------------------------------------ engine: lossless
def test_draft_law_lives_on_the_draft_vocabulary():
    m = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    d2t = torch.arange(1, 32, 3)
    m.ea_layer.set_draft_vocab(d2t)
    outside = torch.ones(32, dtype=torch.bool)
    outside[d2t] = False
    for temperature in (0.0, 1.0):
        laws = m.tree_laws(torch.tensor([1, 5, 2, 7]), tree_choices="2x3", temperature=temperature,
                           generator=torch.Generator().manual_seed(0))
        assert set(laws.tokens[1:].tolist()) <= set(d2t.tolist())
        expanded = laws.draft_probs.sum(-1) > 0
        assert float(laws.draft_probs[:, outside].abs().max()) == 0.0
        torch.testing.assert_close(laws.draft_probs[expanded].sum(-1), torch.ones(int(expanded.sum())))


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "2x3", "chain4"])
def test_temperature_zero_equals_greedy_with_a_draft_vocabulary(tree):
    m = tiny_ea_model(vocab_size=32, seed=5, aligned=True)
    full = torch.cat([torch.tensor([[1, 4, 9]])], dim=1)
    ref = m.naivegenerate(full, temperature=0.0, max_new_tokens=24)
    for d2t in (torch.arange(0, 32, 2), torch.tensor([3]), torch.arange(32)):
        m.ea_layer.set_draft_vocab(d2t)
        out, st = m.eagenerate(full, temperature=0.0, max_new_tokens=24, tree_choices=tree, return_stats=True)
        assert torch.equal(out, ref), f"d2t of size {d2t.numel()}"
    m.ea_layer.set_draft_vocab(None)


@pytest.mark.parametrize("method", ["rrsw", pytest.param("traversal", marks=pytest.mark.slow),
                                    pytest.param("greedy", marks=pytest.mark.slow), "univer"])  # one per rule by default
def test_first_two_tokens_follow_target_with_a_draft_vocabulary(method):
    m = law_model()
    law = exact_two_token_law(m)
    # leave out the target's most likely first token and two more: those come only from residual draws
    top = int(law.sum(1).argmax())
    keep = [t for t in range(V) if t not in (top, (top + 3) % V, (top + 5) % V)]
    m.ea_layer.set_draft_vocab(torch.tensor(keep))
    counts = empirical(m, method, N_RUNS, "2x2")
    assert p_value(counts, law) > P_MIN
    assert counts[top].sum() > 0


def test_cli_counts_the_corpus_and_writes_beside_the_head(tmp_path):
    from eagle.data.corpus import write_shard
    from eagle.train.draft_vocab import main

    m = tiny_ea_model(vocab_size=32, seed=0, eos_token_id=31)
    m.base_model.save_pretrained(tmp_path / "base")
    m.ea_layer.save_pretrained(tmp_path / "head")
    (tmp_path / "corpus" / "run").mkdir(parents=True)
    recs = [{"uid": "a", "split": "train", "turns": [{"prompt_ids": [1, 2], "answer_ids": [5, 5, 5, 7, 7, 9]}]},
            {"uid": "b", "split": "heldout", "turns": [{"prompt_ids": [1], "answer_ids": [3, 3, 3, 3]}]},
            {"uid": "c", "split": "train", "turns": [{"prompt_ids": [4], "answer_ids": [7, 2]}]}]
    write_shard(tmp_path / "corpus" / "run" / "shard_00000.jsonl.gz", recs)
    info = main(["--head", str(tmp_path / "head"), "--base", str(tmp_path / "base"), "--k", "2",
                 "--data", str(tmp_path / "corpus"), "--min-tokens", "0"])
    # counts 5:3, 7:3, 9:1, 2:1 (held-out answers not counted); K=2 = EOS 31 + the most frequent (tie 5/7: 5)
    assert load_draft_vocab(tmp_path / "head").tolist() == [5, 31]
    assert info["counted_tokens"] == 8 and info["k"] == 2
    head = EagleHead.from_pretrained(tmp_path / "head", embedding=m.base_model.get_input_embeddings())
    assert head.d2t.tolist() == [5, 31]


def test_shipped_default_head_has_a_draft_vocabulary():
    from eagle.model.default import DEFAULT_HEAD

    d2t = load_draft_vocab(DEFAULT_HEAD)
    if d2t is None:
        pytest.skip("the default head folder has no draft_vocab.safetensors")
    assert d2t.dtype == torch.long and d2t.numel() == 8192
    assert bool((d2t[1:] > d2t[:-1]).all()) and 0 <= int(d2t[0]) and int(d2t[-1]) < 49152
    assert 2 in set(d2t.tolist())  # SmolLM2's EOS <|im_end|>
