"""Issue 10, engine side: loose ends at the door and the temperature-0 contract in every dtype."""
import json
import warnings

import pytest
import torch

from eagle.model.ea_model import EaModel
from eagle.model.head import CheckpointMismatchError, EagleHead
from eagle.model.kv_cache import new_cache
from eagle.testing import tiny_ea_model

IDS = torch.tensor([[1, 2, 3, 4]])


@pytest.fixture(scope="module")
def model():
    return tiny_ea_model(vocab_size=32, aligned=True)


def test_empty_verifier_name_raises(model):
    with pytest.raises(ValueError, match="verifier"):
        model.eagenerate(IDS, temperature=1.0, max_new_tokens=3, verifier="")
    with pytest.raises(ValueError, match="verifier"):
        model.eagenerate(IDS, temperature=0.0, max_new_tokens=3, verifier="")
    with pytest.raises(ValueError, match="unknown verifier"):
        model.eagenerate(IDS, temperature=0.0, max_new_tokens=3, verifier="nope")


@pytest.mark.parametrize("bad", ["1.0", None, b"1", [1.0], True, torch.tensor([1.0, 2.0])])
def test_temperature_must_be_a_real_number(model, bad):
    with pytest.raises(ValueError, match="temperature"):
        model.eagenerate(IDS, temperature=bad, max_new_tokens=3)
    with pytest.raises(ValueError, match="temperature"):
        model.naivegenerate(IDS, temperature=bad, max_new_tokens=3)
    with pytest.raises(ValueError, match="temperature"):
        model.tree_laws(IDS, temperature=bad)


def test_numeric_temperature_types_are_accepted(model):
    import numpy as np

    a = model.eagenerate(IDS, temperature=np.float32(1.0), max_new_tokens=5, seed=0)
    b = model.eagenerate(IDS, temperature=1, max_new_tokens=5, seed=0)
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("bad", [2 ** 70, 2 ** 64, -1, "3", 1.5, True])
def test_seed_out_of_range_raises(model, bad):
    with pytest.raises(ValueError, match="seed"):
        model.eagenerate(IDS, temperature=1.0, max_new_tokens=3, seed=bad)
    with pytest.raises(ValueError, match="seed"):
        model.naivegenerate(IDS, temperature=1.0, max_new_tokens=3, seed=bad)


def test_largest_seed_works(model):
    model.eagenerate(IDS, temperature=1.0, max_new_tokens=3, seed=2 ** 64 - 1)


def test_prompt_beyond_max_position_embeddings_warns(model):
    limit = model.base_model.config.max_position_embeddings
    long_prompt = torch.randint(0, 32, (1, limit - 2), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="max_position_embeddings"):
        model.eagenerate(long_prompt, max_new_tokens=4, tree_choices="chain4")
    with pytest.warns(UserWarning, match="max_position_embeddings"):
        model.naivegenerate(long_prompt, max_new_tokens=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.eagenerate(IDS, max_new_tokens=4)


def test_head_with_integer_weight_is_refused(tmp_path):
    m = tiny_ea_model(vocab_size=32)
    m.ea_layer.save_pretrained(tmp_path, dtype=torch.float32)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["fc.weight"] = state["fc.weight"].to(torch.int32)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="fc.weight.*int32"):
        EagleHead.from_pretrained(tmp_path, embedding=m.base_model.get_input_embeddings())


def test_tokenizer_failure_is_reported(tmp_path):
    m = tiny_ea_model(vocab_size=32)
    base, head = tmp_path / "base", tmp_path / "head"
    m.base_model.save_pretrained(base)
    m.ea_layer.save_pretrained(head)
    with pytest.warns(UserWarning, match="no tokenizer files"):
        loaded = EaModel.from_pretrained(str(base), str(head))
    assert loaded.tokenizer is None
    (base / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    (base / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(ValueError, match="tokenizer failed to load"):
        EaModel.from_pretrained(str(base), str(head))


# ---------------------------------------------------------------------- the temperature-0 contract
def _tiny_in(dtype, seed):
    m = tiny_ea_model(vocab_size=256, hidden_size=64, seed=seed, aligned=True)
    return m.to(dtype)


def _first_split(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_temperature_0_float32_equals_plain_greedy():
    """float32: token for token (the documented contract; also tests/test_engine.py)."""
    for seed in range(4):
        m = _tiny_in(torch.float32, seed)
        for tree in ["2x5", "mc_sim_7b_63"]:
            ids = torch.tensor([[seed + 1, 7, 30, 2]])
            assert m.eagenerate(ids, max_new_tokens=40, tree_choices=tree).tolist() == \
                m.naivegenerate(ids, max_new_tokens=40).tolist()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("float32_logits", [False, True])
def test_temperature_0_half_precision_splits_only_at_near_ties(dtype, float32_logits):
    """float16 / bfloat16: the outputs agree up to the first position where the plain decoder's top two
    logits are within the dtype's rounding of each other; there, the tree's choice is a near-maximum
    of the plain decoder's logits too (the tree forward and the one-token forward round differently)."""
    eps = torch.finfo(dtype).eps
    splits = 0
    for seed in range(4):
        m = _tiny_in(dtype, seed)
        m.float32_logits = float32_logits
        ids = torch.tensor([[seed + 1, 7, 30, 2]])
        for tree in ["2x5", "mc_sim_7b_63"]:
            ea = m.eagenerate(ids, max_new_tokens=40, tree_choices=tree)[0, 4:].tolist()
            nv = m.naivegenerate(ids, max_new_tokens=40)[0, 4:].tolist()
            k = _first_split(ea, nv)
            if k is None:
                continue
            splits += 1
            # the plain decoder's logits at the split (its own one-token forwards)
            cache = new_cache(m.base_model.config)
            seq = torch.cat([ids, torch.tensor([nv[:k]], dtype=torch.long)], dim=1)
            logits = None
            for i in range(seq.shape[1]):
                _, logits = m.target_forward(seq[:, i:i + 1], torch.tensor([[i]]), cache)
            row = logits[0, -1].float()
            gap = float(row[nv[k]] - row[ea[k]])
            scale = float(row.abs().max())
            assert 0 <= gap <= 64 * eps * max(scale, 1.0), (seed, tree, k, gap, scale)
    assert splits <= 8  # most runs agree token for token


def test_from_pretrained_names_a_missing_base_and_a_missing_head(tmp_path):
    """A missing local base folder and a non-default base without a head get one clear ValueError each
    (before any download); ``drafter=None`` means the default drafter."""
    from eagle.model.ea_model import EaModel

    with pytest.raises(ValueError, match="base model folder .* does not exist"):
        EaModel.from_pretrained(str(tmp_path / "nodir"))
    with pytest.raises(ValueError, match="ea_model_path .* is required for base model 'org/model'"):
        EaModel.from_pretrained("org/model", drafter=None)
