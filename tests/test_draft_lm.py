"""Drafter ``draft_lm`` (a separate draft language model, the paper's Table 7 setting) on tiny random Llamas:
its drafted laws are the draft model's own (plain forward over the committed text + the node's path), temperature
0 equals greedy decoding, seeded runs repeat, the first two tokens follow the target's law with every verifier,
a draft equal to the target accepts everything at temperature 0, one host read per draft, and the one-line
refusals (vocabulary, device, NaN, options, the harness's ``--drafter-option``)."""
import copy
import json

import pytest
import torch
from transformers import LlamaForCausalLM

import univer_patch  # noqa: F401  (traversal, greedy, univer)
from eagle.drafters import DraftLMDrafter, available_drafters, get_drafter
from eagle.model.ea_model import EaModel
from eagle.model.kv_cache import cache_length
from eagle.sampling import SamplingConfig, logits_to_probs
from eagle.testing import tiny_ea_model, tiny_llama_config
from eagle.tree import build_tree
from eagle.verify import available_verifiers
from eagle.verify.checks import prepare_step
from test_e2e_law import p_value

V = 16
PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 3]])
#: an mc_sim-like small tree: 3 children at the root, siblings at depth 2, depth 3
SMALL_MC = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]]
SAMPLED = available_verifiers(1.0)


def target(vocab: int = V, seed: int = 0, **kw) -> EaModel:
    return tiny_ea_model(vocab_size=vocab, seed=seed, **kw)


def random_draft(vocab: int = V, seed: int = 5) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(vocab, 32, 1)).eval()


def noisy_copy(m: EaModel, scale: float, seed: int = 3) -> LlamaForCausalLM:
    """The target's weights plus Gaussian noise (``scale`` x each tensor's std): a draft that agrees often."""
    d = copy.deepcopy(m.base_model).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
    return d


def plain_law(dm, ids: list, cfg: SamplingConfig) -> torch.Tensor:
    """The draft model's processed next-token law after ``ids`` (no cache, causal mask): float32 [V]."""
    logits = dm(input_ids=torch.tensor([ids])).logits[0, -1].float()
    return torch.softmax(logits, -1) if cfg.greedy else logits_to_probs(logits, cfg)


def path_tokens(tree, i: int) -> list:
    out = []
    while i > 0:
        out.append(tree.tokens_list[i])
        i = tree.parents_list[i]
    return out[::-1]


# ------------------------------------------------------------------ the drafted laws are the draft model's
@pytest.mark.parametrize("rule,cfg", [("wor", SamplingConfig(0.7, top_k=6)), ("topk_residual", SamplingConfig(1.0)),
                                      ("topk", SamplingConfig(0.0))])
def test_draft_laws_are_the_draft_models(rule, cfg):
    """Every inner node's row of draft_probs = the draft model's law after committed text + the node's path (a
    plain forward: positions, tree mask and cache truncation all matter), over three cycles with accepts of 1
    to 3 tokens; children are distinct tokens of their parent's support (topk: its top ones); the cache holds
    the committed tokens only after each draft."""
    m = target()
    dm = noisy_copy(m, 0.5)
    d = DraftLMDrafter.for_model(m, model_path_or_module=dm)
    tree = build_tree(SMALL_MC)
    g = torch.Generator().manual_seed(0)
    committed = PROMPT[0].tolist()
    d.start(PROMPT)
    root = 9
    for accepted in ([], [4, 11], [2]):
        committed = committed + [root]
        t = d.draft(root, tree, rule, cfg, g)
        assert cache_length(d.cache) == len(committed)
        assert t.draft_probs.dtype == torch.float32 and t.draft_probs.shape == (t.num_nodes, V)
        assert t.tokens_list[0] == root
        for i in range(t.num_nodes):
            kids = [c for c in range(t.num_nodes) if t.parents_list[c] == i]
            if not kids:
                continue
            law = plain_law(dm, committed + path_tokens(t, i), cfg)
            assert torch.allclose(t.draft_probs[i], law, atol=1e-5), (i, (t.draft_probs[i] - law).abs().max())
            toks = [t.tokens_list[c] for c in kids]
            assert len(set(toks)) == len(toks) and all(law[x] > 0 for x in toks)
            if rule == "topk":
                assert toks == torch.topk(law, len(toks)).indices.tolist()
        prepare_step(t.parents, t.tokens, torch.full((t.num_nodes, V), 1.0 / V), t.draft_probs, rule, True)
        d.accept(torch.tensor([accepted + [root + 1]]))
        committed = committed + accepted
        root = root + 1


def test_one_host_read_per_draft():
    from test_sync_count import HostReadCounter

    m = target()
    d = DraftLMDrafter.for_model(m, model_path_or_module=random_draft())
    tree = build_tree("mc_sim_7b_63")
    d.start(PROMPT)
    g = torch.Generator().manual_seed(0)
    d.draft(3, tree, "wor", SamplingConfig(1.0), g)
    d.accept(torch.tensor([[4, 5]]))
    with HostReadCounter() as c:
        d.draft(5, tree, "wor", SamplingConfig(1.0), g)
    assert sum(c.counts.values()) <= 1, c.what


# ------------------------------------------------------------------ through the engine
@pytest.mark.parametrize("tree", ["2x2", "chain4", SMALL_MC])
@pytest.mark.parametrize("which", ["random", "noisy"])
def test_temperature_zero_equals_greedy(tree, which):
    m = target()
    dm = random_draft() if which == "random" else noisy_copy(m, 0.3)
    d = DraftLMDrafter.for_model(m, model_path_or_module=dm)
    ref = m.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=40)
    out, st = m.eagenerate(PROMPT, temperature=0.0, max_new_tokens=40, tree_choices=tree, drafter=d,
                           return_stats=True)
    assert out.tolist() == ref.tolist()
    if which == "noisy":  # accepted paths (several tokens per accept) were exercised
        assert max(st["accept_lengths"]) > 2


@pytest.mark.parametrize("tree,depth", [("chain4", 4), ("2x3", 3)])
def test_draft_equal_to_target_accepts_everything(tree, depth):
    m = target()
    d = DraftLMDrafter.for_model(m, model_path_or_module=m.base_model)  # the target's own weights
    out, st = m.eagenerate(PROMPT, temperature=0.0, max_new_tokens=41, tree_choices=tree, drafter=d,
                           return_stats=True)
    assert out.tolist() == m.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=41).tolist()
    assert st["accept_lengths"] == [depth + 1] * (40 // (depth + 1)) + ([40 % (depth + 1)] if 40 % (depth + 1) else [])


@pytest.mark.parametrize("method", SAMPLED)
def test_seeded_runs_repeat(method):
    m = target()
    m.set_drafter("draft_lm", model_path_or_module=noisy_copy(m, 0.3))
    kw = dict(temperature=1.0, max_new_tokens=24, verifier=method, tree_choices="2x3")
    a = m.eagenerate(PROMPT, seed=7, **kw)
    assert a.tolist() == m.eagenerate(PROMPT, seed=7, **kw).tolist()
    assert len({tuple(m.eagenerate(PROMPT, seed=s, **kw)[0].tolist()) for s in range(4)}) > 1


# ------------------------------------------------------------------ the output law (statistical)
LAW_V, LAW_PROMPT, LAW_RUNS = 8, torch.tensor([[1, 5, 2]]), 300


def _law_model():
    m = tiny_ea_model(vocab_size=LAW_V, hidden_size=32, seed=4, logit_scale=2.5, aligned=True, align_shrink=0.5)
    return m, noisy_copy(m, 1.2, seed=1)  # accepts 1 to 3 tokens per cycle


def _exact_two_token_law(m) -> torch.Tensor:
    cfg = SamplingConfig(1.0)
    law = torch.zeros(LAW_V, LAW_V, dtype=torch.float64)
    with torch.no_grad():
        p1 = logits_to_probs(m.base_model(LAW_PROMPT).logits[0, -1], cfg).double()
        for x in range(LAW_V):
            seq = torch.cat([LAW_PROMPT, torch.tensor([[x]])], 1)
            law[x] = p1[x] * logits_to_probs(m.base_model(seq).logits[0, -1], cfg).double()
    return law


def _counts(m, d, method) -> torch.Tensor:
    counts = torch.zeros(LAW_V, LAW_V, dtype=torch.float64)
    for s in range(LAW_RUNS):
        out = m.eagenerate(LAW_PROMPT, temperature=1.0, max_new_tokens=2, tree_choices="2x2", verifier=method,
                           seed=s, drafter=d)
        counts[out[0, 3], out[0, 4]] += 1
    return counts


@pytest.mark.parametrize("method", SAMPLED)
def test_first_two_tokens_follow_target(method):
    m, dm = _law_model()
    d = DraftLMDrafter.for_model(m, model_path_or_module=dm)
    assert p_value(_counts(m, d, method), _exact_two_token_law(m)) > 1e-3


class _MisreportingDraftLM(DraftLMDrafter):
    """Broken on purpose: draws children from its law but reports that law sharpened (temperature 0.3)."""

    name = "broken_draft_lm"

    def draft(self, root, tree, rule, cfg, generator=None):
        t = super().draft(root, tree, rule, cfg, generator)
        t.draft_probs = torch.softmax(torch.log(t.draft_probs.clamp_min(1e-30)) / 0.3, -1)
        return t


def test_misreported_laws_fail_the_law_test():
    m, dm = _law_model()
    d = _MisreportingDraftLM(dm, LAW_V)
    assert p_value(_counts(m, d, "rrsw"), _exact_two_token_law(m)) < 1e-3


# ------------------------------------------------------------------ refusals and options
def test_registry_and_refusals(tmp_path):
    assert "draft_lm" in available_drafters() and get_drafter("DRAFT_LM") is DraftLMDrafter
    m = target()
    with pytest.raises(ValueError, match=r"vocabulary \(24 lm_head rows\).*\(16 lm_head rows\)") as e:
        DraftLMDrafter.for_model(m, model_path_or_module=random_draft(vocab=24))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="draft model computes its logits on meta.*cpu"):
        DraftLMDrafter.for_model(m, model_path_or_module=random_draft().to("meta"))
    with pytest.raises(ValueError, match="needs model_path_or_module"):
        m.set_drafter("draft_lm")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['depth'\]"):
        m.set_drafter("draft_lm", model_path_or_module=random_draft(), depth=3)
    with pytest.raises(ValueError, match="dtype must be"):
        DraftLMDrafter.for_model(m, model_path_or_module=random_draft(), dtype="int8")
    eager = random_draft()
    eager.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="cannot apply the tree attention mask"):
        DraftLMDrafter(eager, V)
    d = DraftLMDrafter(random_draft(), V)
    with pytest.raises(ValueError, match="draft before start"):
        d.draft(1, build_tree("2x2"), "wor", SamplingConfig(1.0))
    with pytest.raises(ValueError, match="unknown drafting rule"):
        d.draft(1, build_tree("2x2"), "sample", SamplingConfig(1.0))


def test_nan_draft_logits_refused_in_one_line():
    m = target()
    dm = random_draft()
    with torch.no_grad():
        dm.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match="draft logits .* contain NaN or inf") as e:
        m.eagenerate(PROMPT, temperature=1.0, max_new_tokens=8, tree_choices="2x2", seed=0,
                     drafter=DraftLMDrafter.for_model(m, model_path_or_module=dm))
    assert "\n" not in str(e.value)


def test_loads_a_folder_in_the_target_dtype(tmp_path):
    m = target()
    dm = random_draft()
    dm.save_pretrained(tmp_path / "draft")
    d = DraftLMDrafter.for_model(m, model_path_or_module=str(tmp_path / "draft"))
    assert d.model.dtype == torch.float32 and d.vocab == V
    assert torch.equal(d.model.lm_head.weight, dm.lm_head.weight)
    assert DraftLMDrafter.for_model(m, model_path_or_module=tmp_path / "draft", dtype="bfloat16").model.dtype \
        == torch.bfloat16


def test_a_base_model_without_its_lm_head_is_refused(tmp_path):
    """A folder holding the body only (LlamaModel, untied LM head) would load with a random LM head: refused in one
    line naming the missing weights."""
    from transformers import LlamaModel
    torch.manual_seed(0)
    LlamaModel(tiny_llama_config(vocab_size=V)).save_pretrained(tmp_path / "body")
    with pytest.raises(ValueError, match=r"no weights for .*lm_head") as e:
        DraftLMDrafter.for_model(target(), model_path_or_module=str(tmp_path / "body"))
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ the harness: --drafter-option
def _check(tmp_path, *extra):
    from evaluation import specbench as SB

    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a poem."]}) + "\n")
    return SB.check_arguments(SB._parser().parse_args(["--quick", "--question-file", str(q), *extra]))


def test_harness_drafter_option(tmp_path):
    from evaluation import arguments as A

    cfg = _check(tmp_path, "--drafter", "draft_lm", "--drafter-option", "model_path_or_module=JackFram/llama-68m",
                 "--drafter-option", "dtype=float32", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct",
                 "--out", str(tmp_path / "o"))
    assert cfg.drafter == "draft_lm" and cfg.head is None
    assert cfg.drafter_options == {"model_path_or_module": "JackFram/llama-68m", "dtype": "float32"}
    assert cfg.settings()["drafter_options"] == cfg.drafter_options
    assert _check(tmp_path, "--drafter", "prompt_lookup", "--drafter-option", "depth=8",
                  "--out", str(tmp_path / "p")).drafter_options == {"depth": 8}
    for extra, msg in ((["--drafter", "draft_lm"], "needs model_path_or_module"),
                       (["--drafter", "draft_lm", "--drafter-option", "model_path_or_module"], "use KEY=VALUE"),
                       (["--drafter", "draft_lm", "--drafter-option", "model_path_or_module=x", "--drafter-option",
                         "model_path_or_module=y"], "given twice"),
                       (["--drafter", "draft_lm", "--drafter-option", "model_path_or_module=x", "--drafter-option",
                         "layers=2"], r"unknown option\(s\) \['layers'\]"),
                       (["--drafter", "prompt_lookup", "--drafter-option", "size=2"], r"no option\(s\) \['size'\]")):
        with pytest.raises(A.UsageError, match="--drafter-option: .*" + msg) as e:
            _check(tmp_path, *extra)
        assert "\n" not in str(e.value)


@pytest.mark.filterwarnings("ignore:.*no tokenizer files")
def test_harness_loads_target_and_draft_folders(tmp_path):
    """``load_model`` with the drafter options: the target folder alone (no head), the draft LM from its folder;
    the result decodes as greedy at temperature 0."""
    from evaluation.arguments import load_model

    m = target()
    m.base_model.save_pretrained(tmp_path / "target")
    random_draft().save_pretrained(tmp_path / "draft")
    loaded = load_model(str(tmp_path / "target"), None, "cpu", "float32", drafter="draft_lm",
                        drafter_options={"model_path_or_module": str(tmp_path / "draft")})
    assert isinstance(loaded.drafter, DraftLMDrafter) and loaded.ea_layer is None
    out = loaded.eagenerate(PROMPT, temperature=0.0, max_new_tokens=12, tree_choices="2x2")
    assert out.tolist() == m.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=12).tolist()
