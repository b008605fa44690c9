"""Drafter ``eagle3``: a synthetic EAGLE-3 checkpoint in the public layout (random weights, tiny sizes, a draft
vocabulary smaller than the target's) on a tiny 8-layer target.

Checks: the head's output equals EAGLE-3's architecture written out by hand; the drafted trees' laws equal a
plain sequential recomputation (fused target layers 2 / L//2 / L-3, own outputs fed back) and are zero off the
draft vocabulary; the engine passes exactly those fused hidden states at start and accept; temperature 0 equals
greedy decoding; at temperature 1 every registered verifier is lossless on the head's laws (exact enumeration),
the first-token law of real drafted trees matches the target's (a drafter declaring a wrong law fails it), and
seeded runs repeat; bad checkpoints and bad feature layers fail in one line naming the key / entry.
"""
import json
from pathlib import Path

import pytest
import torch

import univer_patch  # noqa: F401  (traversal, greedy, univer)
from eagle.drafters import Eagle3Drafter, available_drafters, get_drafter
from eagle.model.ea_model import EaModel
from eagle.model.eagle3_head import check_feature_layers, eagle3_feature_layers, load_eagle3_head
from eagle.model.head import CheckpointMismatchError
from eagle.model.kv_cache import new_cache
from eagle.sampling import SamplingConfig
from eagle.testing import tiny_ea_model
from eagle.tree import build_tree
from eagle.verify import get_verifier
from eagle.verify.checks import prepare_step
from eagle.verify.registry import available_verifiers
from exact_law import F64, TOL, Laws, text_law_error

V, LAYERS, H = 12, 8, 32
DRAFT_IDS = [0, 2, 3, 5, 6, 8, 9, 11]  # K = 8 of the 12 target tokens
K = len(DRAFT_IDS)
PROMPT = torch.tensor([[1, 4, 2, 7, 3]])
FUSED = (2, LAYERS // 2, LAYERS - 3)  # EAGLE-3: the hidden states entering layers 2, L//2, L-3


# ------------------------------------------------------------------ synthetic public checkpoint
def eagle3_config(target_cfg, k=K, **extra) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": 2 * H, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "rms_norm_eps": 1e-6, "vocab_size": target_cfg.vocab_size, "draft_vocab_size": k,
           "max_position_embeddings": 1024, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}
    cfg.update(extra)
    return cfg


def random_state(cfg: dict, draft_ids=DRAFT_IDS, seed: int = 0, embed: bool = False) -> dict:
    """Every key of a public EAGLE-3 checkpoint, with the public names and shapes (random values)."""
    g = torch.Generator().manual_seed(seed)
    h, i, v, k = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    ht = cfg.get("target_hidden_size") or h
    hd = h // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def r(*shape, s=0.3):
        return torch.randn(*shape, generator=g) * s

    st = {"fc.weight": r(h, 3 * ht, s=0.1), "midlayer.hidden_norm.weight": 1 + r(h, s=0.1),
          "midlayer.input_layernorm.weight": 1 + r(h, s=0.1), "midlayer.post_attention_layernorm.weight": 1 + r(h, s=0.1),
          "midlayer.self_attn.q_proj.weight": r(nq, 2 * h), "midlayer.self_attn.k_proj.weight": r(nkv, 2 * h),
          "midlayer.self_attn.v_proj.weight": r(nkv, 2 * h), "midlayer.self_attn.o_proj.weight": r(h, nq),
          "midlayer.mlp.gate_proj.weight": r(i, h), "midlayer.mlp.up_proj.weight": r(i, h),
          "midlayer.mlp.down_proj.weight": r(h, i), "norm.weight": 1 + r(h, s=0.1), "lm_head.weight": r(k, h, s=1.2)}
    ids = torch.tensor(sorted(draft_ids))
    st["d2t"] = ids - torch.arange(k)  # target token = draft index + d2t[index]
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    st["t2d"] = t2d
    if embed:
        st["embed_tokens.weight"] = r(v, h, s=1.0)
    return st


def write_checkpoint(folder: Path, cfg: dict, state: dict, fmt: str = "safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return folder


def target(seed: int = 1, layers: int = LAYERS):
    return tiny_ea_model(vocab_size=V, hidden_size=H, num_layers=layers, seed=seed).base_model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    base = target()
    cfg = eagle3_config(base.config)
    return write_checkpoint(tmp_path_factory.mktemp("eagle3"), cfg, random_state(cfg))


def model(path, seed: int = 1, **kw) -> EaModel:
    return EaModel(target(seed), None, drafter="eagle3", drafter_options={"path": str(path)}, **kw)


@pytest.fixture(scope="module")
def path_laws(ckpt):
    """One model and its path laws (cached per path), shared by the law tests."""
    return Eagle3PathLaws(model(ckpt), PROMPT)


# ------------------------------------------------------------------ architecture, by hand
def _rms(x, w, eps=1e-6):
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def hand_law(state: dict, emb: torch.Tensor, feat: torch.Tensor, nh=4, nkv=2) -> torch.Tensor:
    """EAGLE-3 for ONE pair (no past: attention = the value of the position itself), written from the key
    names: fc on the 3 fused layers; [input_layernorm(emb), hidden_norm(h)] into attention; residual h; MLP;
    norm; lm_head; softmax over the draft vocabulary placed on target ids index + d2t (zero elsewhere)."""
    s = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    h = s["fc.weight"] @ feat.double()
    x = torch.cat([_rms(emb.double(), s["midlayer.input_layernorm.weight"]),
                   _rms(h, s["midlayer.hidden_norm.weight"])])
    v = (s["midlayer.self_attn.v_proj.weight"] @ x).view(nkv, -1)
    heads = v.repeat_interleave(nh // nkv, dim=0).flatten()  # each query head reads its key-value head
    h1 = h + s["midlayer.self_attn.o_proj.weight"] @ heads
    z = _rms(h1, s["midlayer.post_attention_layernorm.weight"])
    mlp = s["midlayer.mlp.down_proj.weight"] @ (torch.nn.functional.silu(s["midlayer.mlp.gate_proj.weight"] @ z)
                                                * (s["midlayer.mlp.up_proj.weight"] @ z))
    logits = s["lm_head.weight"] @ _rms(h1 + mlp, s["norm.weight"])
    law = torch.zeros(s["t2d"].shape[0], dtype=F64)
    law[torch.arange(logits.shape[0]) + s["d2t"]] = torch.softmax(logits, 0)
    return law


def test_head_is_eagle3_by_hand(tmp_path):
    base = target()
    cfg = eagle3_config(base.config)
    state = random_state(cfg, seed=5, embed=True)
    head = load_eagle3_head(write_checkpoint(tmp_path, cfg, state), base.config)
    feat = torch.randn(3 * H, generator=torch.Generator().manual_seed(0))
    out = head(torch.tensor([[7]]), feat[None, None])
    got = torch.zeros(V, dtype=F64)
    got[head.targets] = torch.softmax(head.draft_logits(out)[0, 0].double(), 0)
    want = hand_law(state, state["embed_tokens.weight"][7], feat)
    assert torch.allclose(got, want, atol=1e-5)
    assert got[[1, 4, 7, 10]].sum() == 0  # off the draft vocabulary
    # the order of the concatenation matters: embedding first (a swapped variant differs)
    swapped = dict(state)
    w = state["midlayer.self_attn.v_proj.weight"]
    swapped["midlayer.self_attn.v_proj.weight"] = torch.cat([w[:, H:], w[:, :H]], 1)
    assert not torch.allclose(hand_law(swapped, state["embed_tokens.weight"][7], feat), want, atol=1e-3)


def test_pytorch_bin_and_tied_embedding(ckpt, tmp_path):
    """The same weights from pytorch_model.bin (path of the file itself) give the same head; without
    embed_tokens the target's input embedding is used."""
    base = target()
    cfg = json.loads((ckpt / "config.json").read_text())
    write_checkpoint(tmp_path, cfg, random_state(cfg), fmt="bin")
    a = load_eagle3_head(ckpt, base.config, embedding=base.get_input_embeddings())
    b = load_eagle3_head(tmp_path / "pytorch_model.bin", base.config, embedding=base.get_input_embeddings())
    assert a.embed_tokens is base.get_input_embeddings()
    feats = torch.randn(1, 4, 3 * H, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[3, 1, 4, 1]])
    assert torch.equal(a(ids, feats), b(ids, feats))
    assert a.targets.tolist() == DRAFT_IDS


# ------------------------------------------------------------------ laws along paths: a plain recomputation
class Eagle3PathLaws(Laws):
    """Target and draft laws at token paths (root label 0 = the prompt's last token), computed from scratch:
    the target over prompt + path; the head over the whole sequence with no cache, its committed inputs
    ``fc(cat(hidden_states[2], [4], [5]))`` from a plain target forward, its deeper inputs its own outputs."""

    def __init__(self, m: EaModel, prompt: torch.Tensor, temperature: float = 1.0):
        super().__init__(V, "peaked", 0)
        self.m, self.prompt, self.cfg = m, prompt, SamplingConfig(temperature)
        self.head = m.drafter.head
        body = m.base_model.get_decoder()
        with torch.no_grad():
            hs = body(input_ids=prompt[:, :-1], output_hidden_states=True).hidden_states
            self.fc_in = self.head.fc(torch.cat([hs[i] for i in FUSED], -1))  # [1, L-1, H]
        self._rows = {}

    def _head_outputs(self, path: tuple) -> torch.Tensor:
        """The head output at the last node of ``path`` (float ``[H]``)."""
        seq = torch.cat([self.prompt[:, 1:], torch.tensor([list(path[1:])], dtype=torch.long)], 1)
        hid = self.fc_in
        with torch.no_grad():
            for _ in range(len(path) - 1):  # the next position reads this position's output
                out = self.head(seq[:, :hid.shape[1]], hid)[:, -1:]
                hid = torch.cat([hid, out], 1)
            return self.head(seq, hid)[0, -1]

    def draft(self, path: tuple, m: int) -> torch.Tensor:
        if m == 0:
            return torch.full((V,), 1.0 / V, dtype=F64)  # a leaf's row is unused
        if path not in self._rows:  # float64 softmax at temperature 1: rows sum to 1 exactly enough for TOL
            with torch.no_grad():
                logits = self.head.draft_logits(self._head_outputs(path)).double()
            row = torch.zeros(V, dtype=F64)
            row[self.head.targets] = torch.softmax(logits / self.cfg.temperature, 0)
            self._rows[path] = row
        return self._rows[path]

    def __call__(self, path, kind):
        if kind == "draft":
            return self.draft(path, 1)
        key = (path, kind)
        if key not in self._cache:
            ids = torch.cat([self.prompt, torch.tensor([list(path[1:])], dtype=torch.long)], 1)
            _, logits = self.m.target_forward(ids, torch.arange(ids.shape[1])[None], new_cache(self.m.base_model.config))
            self._cache[key] = torch.softmax(logits[0, -1].double() / self.cfg.temperature, 0)
        return self._cache[key]


TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def _path(tree, i: int) -> tuple:
    par, tok, path = tree.parents.tolist(), tree.tokens.tolist(), []
    while i > 0:
        path.append(tok[i])
        i = par[i]
    return (0,) + tuple(path[::-1])


@pytest.mark.parametrize("rule", ["wor", "topk_residual", "topk"])
def test_drafted_laws_equal_a_plain_recomputation(ckpt, rule):
    """Every inner node's draft row (tree attention, cached committed pairs, parent outputs fed back) equals
    the sequential recomputation; target rows too; rows are zero off the draft vocabulary; the drafted
    children are a valid draw of the rule from those rows."""
    m = model(ckpt)
    temp = 0.0 if rule == "topk" else 1.0
    laws = Eagle3PathLaws(m, PROMPT, temperature=max(temp, 1.0))
    tl = m.tree_laws(PROMPT, tree_choices=TREE, drafting=rule, temperature=temp,
                     generator=torch.Generator().manual_seed(3))
    off = [t for t in range(V) if t not in DRAFT_IDS]
    par = tl.parents.tolist()
    inner = {p for p in par if p >= 0}
    assert len(par) == len(TREE) + 1
    for i in range(len(par)):
        path = _path(tl, i)
        if i in inner:
            if temp:
                assert torch.allclose(tl.draft_probs[i].double(), laws.draft(path, 1), atol=2e-5), (rule, i)
            assert float(tl.draft_probs[i, off].abs().sum()) == 0.0
            assert all(t in DRAFT_IDS for t in tl.tokens[[c for c, q in enumerate(par) if q == i]].tolist())
        if temp:
            assert torch.allclose(tl.target_probs[i].double(), laws(path, "target"), atol=2e-5)
    if temp:
        prepare_step(tl.parents, tl.tokens, tl.target_probs, tl.draft_probs, rule, True)
    else:  # topk: the children are the draft's top tokens at their parent, in rank order
        for i in inner:
            row = laws.draft(_path(tl, i), 1)
            kids = [c for c, q in enumerate(par) if q == i]
            assert tl.tokens[kids].tolist() == torch.argsort(row, descending=True, stable=True)[:len(kids)].tolist()


class Spy(Eagle3Drafter):
    """Records the features the engine passes (start, then every accept)."""

    def start(self, input_ids, features=None):
        self.seen = [features.clone()]
        super().start(input_ids, features)

    def accept(self, tokens, features=None):
        self.seen.append(features.clone())
        super().accept(tokens, features)


def test_engine_passes_the_fused_layers(ckpt):
    """Start + accept features, in order, are cat(hidden_states[2], [L//2], [L-3]) of every committed position
    (a plain forward over the output; accepted paths of several tokens included)."""
    m = model(ckpt)
    spy = Spy(m.drafter.head, m.lm_head, m.drafter.feature_layers)
    assert spy.feature_layers == FUSED == eagle3_feature_layers(LAYERS)
    out, st = m.eagenerate(PROMPT, temperature=0.0, max_new_tokens=30, drafter=spy, tree_choices="mc_sim_7b_63",
                           return_stats=True)
    assert max(st["accept_lengths"]) >= 3  # multi-token accepts are exercised
    got = torch.cat(spy.seen, 1)
    with torch.no_grad():
        hs = m.base_model.get_decoder()(input_ids=out, output_hidden_states=True).hidden_states
    want = torch.cat([hs[i] for i in FUSED], -1)[:, :got.shape[1]]
    assert got.shape[-1] == 3 * H and got.shape[1] >= out.shape[1] - 3
    assert torch.allclose(got, want, atol=1e-4)
    other = torch.cat([hs[i] for i in (1, 4, 5)], -1)[:, :got.shape[1]]  # another layer choice differs
    assert not torch.allclose(got, other, atol=1e-2)


@pytest.mark.parametrize("tree,fast", [("mc_sim_7b_63", False), ([[0], [0, 0], [0, 0, 0], [1]], False),
                                       ("2x2", True)])
def test_temperature_zero_equals_greedy(ckpt, tree, fast):
    for seed in ((1, 2) if fast else (1,)):
        m = model(ckpt, seed=seed)
        if fast:
            m.set_fast_cpu(True)
        ref = m.naivegenerate(PROMPT, temperature=0.0, max_new_tokens=40)
        out, st = m.eagenerate(PROMPT, temperature=0.0, max_new_tokens=40, tree_choices=tree, return_stats=True)
        assert out.tolist() == ref.tolist()
        assert sum(st["accept_lengths"]) == 39


HOT = [v for v in available_verifiers(temperature=1.0)]


@pytest.mark.parametrize("method", HOT)
def test_lossless_by_enumeration(path_laws, method):
    """Exact: every tree the verifier's rule draws from the head's laws (zero off the draft vocabulary), with
    the target's laws, gives the target's law of the first 3 tokens."""
    assert {"rrsw", "traversal", "greedy", "univer"} <= set(HOT)
    v = get_verifier(method)
    err, tau = text_law_error(v.outcome_probs, [[0], [1], [0, 0]], v.drafting, path_laws)
    assert err < TOL, f"{method} with eagle3 not lossless: {err:.3g}"
    assert 1.0 < tau <= 3.0


def _first_token_counts(laws, v, n: int, drafter) -> tuple[torch.Tensor, torch.Tensor]:
    """n trees drafted by ``drafter`` under v's rule (real draws, the drafter started once on the prompt); per
    tree the verifier's exact law of the first emitted token (target rows from the plain recomputation).
    Returns (n x the mean of those laws, the target's law of the first token)."""
    m = laws.m
    ctx = PROMPT[:, :-1]
    feats, _ = m.target_forward(ctx, torch.arange(ctx.shape[1])[None], new_cache(m.base_model.config),
                                feature_layers=drafter.feature_layers)
    drafter.start(ctx, feats)
    tree, cfg, g = build_tree([[0], [1], [0, 0]]), SamplingConfig(1.0), torch.Generator().manual_seed(11)
    total = torch.zeros(V, dtype=F64)
    for _ in range(n):
        t = drafter.draft(int(PROMPT[0, -1]), tree, v.drafting, cfg, g)
        par, tok = t.parents_list, t.tokens_list
        target_rows = torch.stack([laws(_path(t, i), "target") for i in range(len(par))])
        law = v.outcome_probs(t.parents, t.tokens, target_rows, t.draft_probs.double(), validate=False,
                              structure=t.structure)  # [nodes, V]
        total += law[0]  # node 0 accepted: y is the first token
        for i in range(1, len(par)):
            j = i
            while par[j] != 0:
                j = par[j]
            total[tok[j]] += law[i].sum()  # else the accepted path's first node is
    return total, laws((0,), "target")


def _p_value(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson chi-square (outcomes expected < 5 pooled). ``counts`` are n x mean exact laws (less spread than
    n samples, so the test only errs towards passing a correct drafter)."""
    from scipy.stats import chisquare

    n = float(counts.sum())
    exp = law * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([exp[big], exp[~big].sum()[None]])
    return float(chisquare(obs.numpy(), exp.numpy() * float(obs.sum() / exp.sum())).pvalue)


class WrongLaw(Eagle3Drafter):
    """Negative control: declares a uniform root law over the draft vocabulary (not the one it drew from)."""

    def draft(self, root, tree, rule, cfg, generator=None):
        t = super().draft(root, tree, rule, cfg, generator)
        t.draft_probs[0] = 0.0
        t.draft_probs[0, torch.tensor(DRAFT_IDS)] = 1.0 / K
        return t


@pytest.mark.parametrize("method", HOT)
def test_first_token_law_of_drafted_trees(path_laws, method):
    """The first emitted token of real drafted trees follows the target's law (chi-square, p > 1e-3); a
    drafter that declares a law other than the one it drew from fails the same test (RRSw)."""
    d = path_laws.m.drafter
    v = get_verifier(method)
    counts, law = _first_token_counts(path_laws, v, 200, d)
    assert _p_value(counts, law) > 1e-3
    if method == "rrsw":
        bad = WrongLaw(d.head, d.lm_head, d.feature_layers)
        counts, law = _first_token_counts(path_laws, v, 200, bad)
        assert _p_value(counts, law) < 1e-3


@pytest.mark.parametrize("method", HOT)
def test_seeded_runs_repeat(ckpt, method):
    m = model(ckpt)
    kw = dict(temperature=1.0, max_new_tokens=10, verifier=method, tree_choices="2x2")
    a = m.eagenerate(PROMPT, seed=7, **kw)
    assert a.tolist() == m.eagenerate(PROMPT, seed=7, **kw).tolist()
    assert len({tuple(m.eagenerate(PROMPT, seed=s, **kw)[0].tolist()) for s in range(3)}) > 1


# ------------------------------------------------------------------ doors: checkpoints and feature layers
def _bad(tmp_path, edit, cfg_edit=None):
    base = target()
    cfg = eagle3_config(base.config)
    state = random_state(cfg)
    if cfg_edit:  # checked before the weights' shapes
        cfg_edit(cfg)
    edit(state)
    folder = write_checkpoint(tmp_path, cfg, state)
    with pytest.raises(ValueError) as e:
        load_eagle3_head(folder, base.config, embedding=base.get_input_embeddings())
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_checkpoints_fail_in_one_line(tmp_path):
    def rename(s):
        s["midlayer.hiden_norm.weight"] = s.pop("midlayer.hidden_norm.weight")

    assert "unexpected key 'midlayer.hiden_norm.weight'" in _bad(tmp_path / "a", rename)
    assert "missing key 'midlayer.hidden_norm.weight'" in _bad(
        tmp_path / "b", lambda s: s.pop("midlayer.hidden_norm.weight"))
    assert "'fc.weight' has shape (32, 64)" in _bad(tmp_path / "c", lambda s: s.update({"fc.weight": torch.zeros(H, 2 * H)}))
    assert "'midlayer.self_attn.q_proj.weight' has shape" in _bad(
        tmp_path / "d", lambda s: s.update({"midlayer.self_attn.q_proj.weight": torch.zeros(H, H)}))
    assert "missing key 'd2t'" in _bad(tmp_path / "e", lambda s: s.pop("d2t"))
    assert "missing key 't2d'" in _bad(tmp_path / "f", lambda s: s.pop("t2d"))
    assert "'lm_head.weight' has shape" in _bad(tmp_path / "g", lambda s: s.update({"lm_head.weight": torch.zeros(V, H)}))
    assert "t2d marks" in _bad(tmp_path / "h", lambda s: s["t2d"].__setitem__(1, True))
    assert "same target token" in _bad(tmp_path / "i", lambda s: s["d2t"].__setitem__(1, -1))
    assert "outside the vocabulary" in _bad(tmp_path / "j", lambda s: s["d2t"].__setitem__(K - 1, 5))
    assert "NaN or inf" in _bad(tmp_path / "k", lambda s: s["norm.weight"].__setitem__(0, float("nan")))
    assert "'d2t' has dtype" in _bad(tmp_path / "l", lambda s: s.update({"d2t": s["d2t"].float()}))
    assert "target's hidden_size is 32" in _bad(tmp_path / "m", lambda s: None,
                                                lambda c: c.update({"target_hidden_size": 48}))
    assert "vocab_size 13 != target vocab_size 12" in _bad(tmp_path / "n", lambda s: None,
                                                            lambda c: c.update({"vocab_size": 13}))
    assert "draft_vocab_size" in _bad(tmp_path / "o", lambda s: None, lambda c: c.pop("draft_vocab_size"))


def test_identity_vocab_may_omit_d2t(tmp_path):
    """K = V: d2t / t2d may be left out (EAGLE-3 deletes them then); the law covers every token."""
    base = target()
    cfg = eagle3_config(base.config, k=V)
    state = random_state(cfg, draft_ids=range(V))
    del state["d2t"], state["t2d"]
    head = load_eagle3_head(write_checkpoint(tmp_path, cfg, state), base.config, embedding=base.get_input_embeddings())
    assert head.targets is None
    m = model(tmp_path)
    assert m.eagenerate(PROMPT, max_new_tokens=12).tolist() == m.naivegenerate(PROMPT, max_new_tokens=12).tolist()


def test_feature_layers_are_checked_against_the_target(ckpt):
    assert eagle3_feature_layers(8) == (2, 4, 5) and eagle3_feature_layers(32) == (2, 16, 29)
    with pytest.raises(ValueError, match="L >= 3 decoder layers; the target has 2"):
        EaModel(target(layers=2), None, drafter="eagle3", drafter_options={"path": str(ckpt)})
    with pytest.raises(ValueError, match="entry 9 is not a hidden-state index .* 8 decoder layers"):
        model(ckpt).set_drafter("eagle3", path=str(ckpt), feature_layers=(2, 4, 9))
    with pytest.raises(ValueError, match="2 feature layers of width 32 do not fit"):
        model(ckpt).set_drafter("eagle3", path=str(ckpt), feature_layers=(2, 4))
    with pytest.raises(ValueError, match="needs the EAGLE-3 head"):
        model(ckpt).set_drafter("eagle3")
    assert check_feature_layers([0, 8], 8) == (0, 8)
    for bad in ((-1,), (True,), (), "24", (2.0,)):
        with pytest.raises(ValueError):
            check_feature_layers(bad, 8)
    # the engine checks a drafter's declaration before the target forward
    m = model(ckpt)
    d = m.drafter
    d.feature_layers = (2, 4, 12)
    with pytest.raises(ValueError, match="entry 12 is not a hidden-state index"):
        m.eagenerate(PROMPT, max_new_tokens=4)
    # an engine that passed the last hidden state (H wide) is refused by the drafter
    with pytest.raises(ValueError, match=r"needs the target's fused hidden states \(2, 4, 12\)"):
        d.start(PROMPT, torch.zeros(1, 5, H))
    # explicit layers of the right count are used as given
    m.set_drafter("eagle3", path=str(ckpt), feature_layers=(1, 3, 8))
    assert m.eagenerate(PROMPT, max_new_tokens=12).tolist() == m.naivegenerate(PROMPT, max_new_tokens=12).tolist()


def test_registry_and_other_drafters_unchanged(ckpt):
    assert "eagle3" in available_drafters() and get_drafter("EAGLE3") is Eagle3Drafter
    assert not Eagle3Drafter.needs_head and Eagle3Drafter.needs_features
    from eagle.drafting import Drafter, EagleTreeDrafter

    assert Drafter.feature_layers is None and EagleTreeDrafter.feature_layers is None
    m = tiny_ea_model(vocab_size=V, num_layers=LAYERS, seed=1)
    feats, _ = m.target_forward(PROMPT, torch.arange(5)[None], new_cache(m.base_model.config))
    f3, _ = m.target_forward(PROMPT, torch.arange(5)[None], new_cache(m.base_model.config), feature_layers=(LAYERS,))
    assert torch.equal(feats, f3)  # hidden_states[L] is the last hidden state after the final norm
