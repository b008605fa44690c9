"""Drafter options refused at the door, in one line naming the flag (bench_cycle --drafters, bench_peers --ours,
gen_answer --drafter-option) and in the Python API (one ValueError naming the drafter and the option)."""
import pytest

from evaluation.arguments import UsageError, check_drafter_options, check_option_dict


@pytest.fixture()
def eagle3_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize("drafter,options,words", [
    ("hybrid", {"lookup_weight": 2}, "hybrid: lookup_weight must be a number in (0, 1]"),
    ("hybrid", {"depth": 0}, "hybrid: depth must be an integer >= 1"),
    ("hybrid", {"depth": "abc"}, "hybrid: depth must be an integer >= 1"),
    ("hybrid", {"foo": 1}, "drafter 'hybrid' takes no option(s) ['foo']"),
    ("hybrid", {"max_ngram": 1}, "hybrid: min_ngram 2 > max_ngram 1 (min_ngram defaults to 2: give min_ngram=1"),
    ("hybrid", {"min_ngram": 0}, "hybrid: min_ngram must be an integer >= 1"),
    ("prompt_lookup", {"depth": 0}, "prompt_lookup: depth must be an integer >= 1"),
    ("prompt_lookup", {"min_ngram": 4}, "prompt_lookup: min_ngram 4 > max_ngram 3"),
    ("prompt_lookup", {"branches": -1}, "prompt_lookup: branches must be"),
    ("draft_lm", {"model_path_or_module": "/nonexistent"}, "draft model folder /nonexistent does not exist"),
    ("draft_lm", {"model_path_or_module": "./no/such/dir"}, "does not exist"),
])
def test_option_values_checked_without_a_model(drafter, options, words):
    with pytest.raises(ValueError) as e:
        check_option_dict(drafter, options)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_eagle3_feature_layers_checked_at_the_door(eagle3_folder):
    with pytest.raises(ValueError, match="drafter 'eagle3': feature_layers"):
        check_option_dict("eagle3", {"path": str(eagle3_folder), "feature_layers": "abc"})
    assert check_option_dict("eagle3", {"path": str(eagle3_folder), "feature_layers": [1, 2]})


def test_good_options_pass():
    assert check_option_dict("hybrid", {"lookup_weight": 0.7, "depth": 4}) == {"lookup_weight": 0.7, "depth": 4}
    assert check_option_dict("prompt_lookup", {"branches": 2})
    assert check_option_dict("draft_lm", {"model_path_or_module": "JackFram/llama-68m"})  # a hub id: not checked here


def test_gen_answer_door_names_drafter_option():
    with pytest.raises(UsageError) as e:
        check_drafter_options(["lookup_weight=2"], "hybrid")
    assert str(e.value).startswith("--drafter-option") and "lookup_weight" in str(e.value)


@pytest.mark.parametrize("spec,words", [
    ("hybrid@lookup_weight=2", "lookup_weight must be a number"),
    ("prompt_lookup@depth=0", "prompt_lookup: depth must be"),
    ("draft_lm@model_path_or_module=/nonexistent", "draft model folder /nonexistent does not exist"),
])
def test_bench_cycle_refuses_bad_values_in_one_line(spec, words, capsys):
    from evaluation.bench_cycle import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--drafters", spec])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_cycle: error: --drafters:") and words in err
    assert "\n" not in err and "usage" not in err  # finding 13: no usage block


def test_bench_cycle_load_failure_is_one_line(tmp_path, capsys):
    from evaluation.bench_cycle import main

    empty = tmp_path / "not_a_model"
    empty.mkdir()
    with pytest.raises(SystemExit) as e:
        main(["--model", "tiny", "--trees", "chain2", "--drafters", f"draft_lm@model_path_or_module={empty}",
              "--new-tokens", "2", "--rounds", "1", "--no-warmup", "--context-tokens", "8",
              "--out", str(tmp_path / "o")])
    msg = str(e.value.code)
    assert msg.startswith("bench_cycle: error: --drafters:") and "draft_lm" in msg and "\n" not in msg


def test_bench_peers_refuses_bad_values_before_loading():
    from evaluation.bench_peers import parse_ours

    for spec, words in (("hybrid@lookup_weight=2:2x2", "lookup_weight"), ("prompt_lookup@depth=-1", "depth"),
                        ("draft_lm@model_path_or_module=/nonexistent", "does not exist")):
        with pytest.raises(UsageError) as e:
            parse_ours([spec], 0.0, "univer")
        assert str(e.value).startswith("--ours") and words in str(e.value)


def test_bench_peers_build_failure_is_a_value_error(tmp_path):
    """An existing folder that is not a model: transformers' OSError becomes one ValueError line (build_drafters
    turns it into --ours)."""
    from eagle.drafters import make_drafter
    from eagle.testing import tiny_ea_model

    empty = tmp_path / "x"
    empty.mkdir()
    with pytest.raises(ValueError, match="drafter 'draft_lm': cannot load the draft model"):
        make_drafter("draft_lm", tiny_ea_model(), model_path_or_module=str(empty))


def test_harness_load_failure_from_drafter_names_drafter_option(monkeypatch):
    import evaluation.arguments as A
    from eagle.testing import tiny_ea_model

    def load(*a, **k):
        m = tiny_ea_model()
        m.set_drafter("draft_lm", model_path_or_module=tiny_ea_model)  # not a module nor a path: refused
        return m

    monkeypatch.setattr(A, "load_model", load)
    from types import SimpleNamespace

    cfg = SimpleNamespace(model="default", head=None, device="cpu", dtype="auto", threads=0, drafter="draft_lm",
                          drafter_options={"model_path_or_module": "x"}, draft_vocab="auto", template=None)
    with pytest.raises(UsageError) as e:
        A.load_checked_model(cfg)
    assert str(e.value).startswith("--drafter-option")


# ---- the Python API ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("drafter,options", [("hybrid", {"foo": 1}), ("prompt_lookup", {"foo": 1}),
                                             ("eagle3", {"path": "/nonexistent", "foo": 1})])
def test_api_unknown_option_is_a_value_error(drafter, options):
    from eagle.testing import tiny_ea_model

    m = tiny_ea_model()
    with pytest.raises(ValueError) as e:
        m.set_drafter(drafter, **options)
    assert f"drafter {drafter!r}" in str(e.value) and "option(s) ['foo']" in str(e.value)
    assert "\n" not in str(e.value)


def test_api_hybrid_depth_names_hybrid():
    from eagle.testing import tiny_ea_model

    with pytest.raises(ValueError, match="^hybrid: depth"):
        tiny_ea_model().set_drafter("hybrid", depth=0)


def test_register_twice_mentions_overwrite():
    from eagle.drafters import PromptLookupDrafter, register_drafter, unregister_drafter

    class Again(PromptLookupDrafter):
        name = "door_test_again"

    class Other(PromptLookupDrafter):
        name = "door_test_again"

    register_drafter(Again)
    try:
        with pytest.raises(ValueError, match="overwrite=True"):
            register_drafter(Other)
    finally:
        unregister_drafter("door_test_again")


# ---- help and messages (finding 9) ------------------------------------------------------------------------

def test_drafter_help_lists_every_registered_drafter():
    import argparse

    from eagle.drafters import PromptLookupDrafter, available_drafters, register_drafter, unregister_drafter
    from evaluation.arguments import add_common_arguments

    class Plug(PromptLookupDrafter):
        name = "door_test_plug"

    register_drafter(Plug)
    try:
        ap = argparse.ArgumentParser()
        add_common_arguments(ap)
        text = " ".join(ap.format_help().split())
        for name in available_drafters():
            assert name in text, name
        assert "path=HEAD_FOLDER" in text and "hybrid (" in text
    finally:
        unregister_drafter("door_test_plug")


def test_unknown_tree_mentions_eagle2(capsys):
    from evaluation.arguments import check_tree
    from evaluation.bench_cycle import parse_args

    with pytest.raises(UsageError, match=r"eagle2\[:nodes=N,depth=D,topk=K\[,adapt=1\]\]"):
        check_tree("garbage")
    with pytest.raises(SystemExit):
        parse_args(["--trees", "garbage"])
    assert "eagle2[:nodes=N,depth=D,topk=K[,adapt=1]]" in capsys.readouterr().err


def test_importing_the_drafters_loads_no_transformers_model_code():
    """Finding 5: the door (drafter names and options) does not pay for transformers' Llama modelling code."""
    import subprocess
    import sys

    code = ("import sys, eagle.drafters; from evaluation.arguments import check_option_dict; "
            "check_option_dict('hybrid', {'depth': 3}); "
            "print(sorted(m for m in sys.modules if m.startswith('transformers.models.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "modeling_llama" not in out, out
