"""Weight averaging of draft heads (eagle.train.average)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle.train.average import average_heads, average_state_dicts, main


def _head(d, seed, shape=(3, 4), cfg=None, vocab=True):
    g = torch.Generator().manual_seed(seed)
    d.mkdir(parents=True)
    save_file({"fc.weight": torch.randn(*shape, generator=g).half(), "fc.bias": torch.randn(shape[0], generator=g)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg or {"num_hidden_layers": 1}))
    if vocab:
        save_file({"d2t": torch.arange(5)}, str(d / "draft_vocab.safetensors"))
    return d


def test_mean_of_two_heads_is_elementwise_mean_in_each_dtype(tmp_path):
    a, b = _head(tmp_path / "a", 0), _head(tmp_path / "b", 1)
    out = average_heads([a, b], tmp_path / "avg")
    sa, sb, so = (load_file(str(p / "model.safetensors")) for p in (a, b, out))
    for k in sa:
        assert so[k].dtype == sa[k].dtype
        want = ((sa[k].float() + sb[k].float()) / 2).to(sa[k].dtype)
        assert torch.equal(so[k], want)
        assert not torch.equal(so[k], sa[k])
    assert (out / "config.json").read_text() == (a / "config.json").read_text()
    assert torch.equal(load_file(str(out / "draft_vocab.safetensors"))["d2t"], torch.arange(5))


def test_weights_one_zero_give_the_first_head_and_identical_heads_are_fixed_points(tmp_path):
    a, b = _head(tmp_path / "a", 0), _head(tmp_path / "b", 1)
    sa = load_file(str(a / "model.safetensors"))
    s = average_state_dicts([sa, load_file(str(b / "model.safetensors"))], [1.0, 0.0])
    assert all(torch.equal(s[k], sa[k]) for k in sa)
    s2 = average_state_dicts([sa, sa, sa], [0.2, 0.3, 0.5])
    assert all(torch.allclose(s2[k].float(), sa[k].float(), atol=1e-3) for k in sa)


@pytest.mark.parametrize("weights, msg", [([0.5], "1 weights for 2 heads"), ([0.7, 0.7], "sum to 1"),
                                          ([1.5, -0.5], ">= 0"), ([float("nan"), 0.5], "finite")])
def test_bad_weights_raise(tmp_path, weights, msg):
    s = load_file(str(_head(tmp_path / "a", 0) / "model.safetensors"))
    with pytest.raises(ValueError, match=msg):
        average_state_dicts([s, s], weights)


def test_mismatched_heads_raise_clear_errors(tmp_path):
    a = _head(tmp_path / "a", 0)
    with pytest.raises(ValueError, match="fc.weight"):
        average_heads([a, _head(tmp_path / "b", 1, shape=(3, 5))], tmp_path / "o1")
    with pytest.raises(ValueError, match="config.json differs"):
        average_heads([a, _head(tmp_path / "c", 1, cfg={"num_hidden_layers": 2})], tmp_path / "o2")
    with pytest.raises(ValueError, match="only some heads"):
        average_heads([a, _head(tmp_path / "d", 1, vocab=False)], tmp_path / "o3")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        average_heads([a, tmp_path / "missing"], tmp_path / "o4")
    with pytest.raises(ValueError, match="is one of the heads"):
        average_heads([a, _head(tmp_path / "e", 1)], a)


def test_cli_names_the_flag(tmp_path, capsys):
    a = _head(tmp_path / "a", 0)
    with pytest.raises(SystemExit):
        main(["--heads", str(a), "--out", str(tmp_path / "o")])
    assert "--heads" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--heads", f"{a},{a}", "--weights", "x,y", "--out", str(tmp_path / "o")])
    assert "--weights" in capsys.readouterr().err
    out = main(["--heads", f"{a},{_head(tmp_path / 'b', 1)}", "--out", str(tmp_path / "o")])
    assert json.loads((out / "average.json").read_text())["weights"] == [0.5, 0.5]
