"""``--drafter`` in the harness: checked at the door, recorded in the settings, the answers and the run label."""
import json

import pytest
import torch

from evaluation import arguments as A
from evaluation import gen_answer as G
from evaluation import specbench as SB


def _check(tmp_path, *extra):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a poem."]}) + "\n")
    return SB.check_arguments(SB._parser().parse_args(["--quick", "--question-file", str(q), *extra]))


def test_drafter_flag_is_checked_and_recorded(tmp_path):
    cfg = _check(tmp_path, "--drafter", "prompt_lookup", "--out", str(tmp_path / "o"))
    assert cfg.drafter == "prompt_lookup" and cfg.settings()["drafter"] == "prompt_lookup"
    assert _check(tmp_path, "--out", str(tmp_path / "p")).drafter == "eagle"
    with pytest.raises(A.UsageError, match="--drafter: unknown drafter 'nope'"):
        _check(tmp_path, "--drafter", "nope")
    # no head needed for a drafter without one, even for a non-default model
    cfg = _check(tmp_path, "--drafter", "prompt_lookup", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct",
                 "--out", str(tmp_path / "q"))
    assert cfg.head is None


def test_answers_name_the_drafter(tmp_path):
    from eagle.testing import tiny_ea_model

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    m = tiny_ea_model(vocab_size=16, seed=0)
    m.set_drafter("prompt_lookup")
    f = tmp_path / "a.jsonl"
    q = [{"question_id": 1, "category": "writing", "turns": ["x"]}]
    G.generate_answers(m, q, f, "rrsw", temperature=0.0, max_new_tokens=8, tree="2x5", seed=0, tokenizer=Tok(),
                       progress=False, warmup=False, prompt_builder=lambda tok, msgs: [1, 2, 3, 1, 2])
    rec = json.loads(f.read_text().splitlines()[0])
    assert rec["drafter"] == "prompt_lookup" and "rrsw+prompt_lookup" in rec["model_id"]


def test_headless_drafter_and_the_auto_trees(tmp_path):
    """A drafter without an EAGLE head: the default speed tree ('auto', fitted to the head) is dropped (the 2x5
    runs are timed); 'auto' named explicitly is refused in one line naming the flag."""
    cfg = _check(tmp_path, "--drafter", "prompt_lookup", "--device", "cpu", "--out", str(tmp_path / "o"))
    assert cfg.speed_tree == "none" and cfg.speed_methods == []
    with pytest.raises(A.UsageError, match="--speed-tree: 'auto' is fitted to the EAGLE head"):
        _check(tmp_path, "--drafter", "prompt_lookup", "--speed-tree", "auto", "--out", str(tmp_path / "p"))
    with pytest.raises(A.UsageError, match="--tree: 'auto' is fitted to the EAGLE head"):
        _check(tmp_path, "--drafter", "prompt_lookup", "--tree", "auto", "--out", str(tmp_path / "q"))
    from eagle.model.ea_model import CPU_DEFAULT_TREE

    assert _check(tmp_path, "--device", "cpu", "--out", str(tmp_path / "r")).speed_tree == CPU_DEFAULT_TREE  # the head's
