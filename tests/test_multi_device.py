"""Issue 49 item 5: targets sharded over devices or offloaded, and attention that cannot take a tree mask.

On the CPU: the placement rule as a pure function (module devices -> chosen devices), the execution
device of accelerate-hooked (offloaded) modules, an offloaded target end to end (its weights on ``meta``
until each forward; the lm_head's too), per-device timing and synchronisation as calls, and the refusal
of flash / flex attention. ``scripts/device_check.py`` runs the ``cuda:1`` placement when two GPUs are lent.
"""
import types

import pytest
import torch
from torch import nn

import univer_patch  # noqa: F401  (registers traversal / greedy / univer)
from eagle.model import ea_model as E
from eagle.model.device import Placement, module_device, resolve_placement, target_placement
from eagle.testing import tiny_ea_model

IDS = torch.tensor([[1, 2, 3, 4, 5]])
cuda = torch.device


def test_placement_rule_from_module_devices():
    # device_map="auto" over two GPUs plus CPU / disk offload: ids to the embedding's device, laws to lm_head's
    p = resolve_placement(0, "cuda:1", [0, 0, 1, "cpu", "disk", torch.device("meta")])
    assert p == Placement(input=cuda("cuda", 0), output=cuda("cuda", 1), cuda=(cuda("cuda", 0), cuda("cuda", 1)))
    assert p.sharded
    # --device cuda:1: one device, not the current one
    p = resolve_placement("cuda:1", "cuda:1", ["cuda:1"])
    assert p.input == p.output == cuda("cuda", 1) and p.cuda == (cuda("cuda", 1),) and not p.sharded
    # the CPU; an unindexed "cuda" is the current device (0 without CUDA)
    assert resolve_placement("cpu", "cpu") == Placement(cuda("cpu"), cuda("cpu"), ())
    assert resolve_placement("cuda", "cuda").cuda == (cuda("cuda", 0),)
    # an offloaded model computing on one GPU: weights on meta/cpu, execution on cuda:0
    assert resolve_placement("cuda:0", "cuda:0", ["cpu", "meta"]).cuda == (cuda("cuda", 0),)


def test_module_device_prefers_the_execution_device_of_a_hook():
    lin = nn.Linear(2, 2, device="meta")  # an offloaded module: weight on meta until its forward
    lin._hf_hook = types.SimpleNamespace(execution_device=1)
    assert module_device(lin) == cuda("cuda", 1)
    lin._hf_hook = types.SimpleNamespace(hooks=[types.SimpleNamespace(execution_device="cuda:2")])  # SequentialHook
    assert module_device(lin) == cuda("cuda", 2)
    assert module_device(nn.Linear(2, 2)) == cuda("cpu") and module_device(nn.Identity()) == cuda("cpu")


def test_target_placement_of_a_dispatched_map():
    model = tiny_ea_model(vocab_size=32, seed=0)
    base = model.base_model
    base.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
                          "lm_head": "disk"}
    base.model.embed_tokens._hf_hook = types.SimpleNamespace(execution_device=0)
    base.lm_head._hf_hook = types.SimpleNamespace(execution_device=1)
    try:
        p = target_placement(base)
        assert (p.input, p.output, p.cuda) == (cuda("cuda", 0), cuda("cuda", 1), (cuda("cuda", 0), cuda("cuda", 1)))
        assert model.device == cuda("cuda", 1)  # head, drafting, laws and generator go with lm_head
    finally:
        del base.hf_device_map, base.model.embed_tokens._hf_hook, base.lm_head._hf_hook
    assert model.placement == Placement(cuda("cpu"), cuda("cpu"), ())


@pytest.mark.parametrize("draft_vocab", [False, True])
def test_offloaded_target_generates_what_the_resident_one_does(draft_vocab):
    """accelerate's cpu_offload: every target weight (lm_head's too) is on meta until its forward; the engine
    takes its devices from the hooks (it used to put the generator and the tree on meta)."""
    accelerate = pytest.importorskip("accelerate")
    model = tiny_ea_model(vocab_size=32, seed=1, aligned=True)
    if draft_vocab:
        model.ea_layer.set_draft_vocab(torch.arange(0, 32, 2))
    runs = [dict(temperature=0.0), dict(temperature=1.0, verifier="univer", seed=3),
            dict(temperature=1.0, verifier="rrsw", seed=4)]
    ref = [model.eagenerate(IDS, max_new_tokens=14, tree_choices="2x5", **kw).tolist() for kw in runs]
    ref_naive = model.naivegenerate(IDS, temperature=1.0, max_new_tokens=8, seed=5).tolist()
    accelerate.cpu_offload(model.base_model, execution_device=torch.device("cpu"))
    assert model.lm_head.weight.device.type == "meta" and model.device == cuda("cpu")
    got = [model.eagenerate(IDS, max_new_tokens=14, tree_choices="2x5", **kw).tolist() for kw in runs]
    assert got == ref
    assert model.naivegenerate(IDS, temperature=1.0, max_new_tokens=8, seed=5).tolist() == ref_naive
    _, st = model.eagenerate(IDS, temperature=1.0, max_new_tokens=10, tree_choices="2x2", verifier="univer", seed=0,
                             return_stats=True, expected_tau=True)
    assert len(st["expected_accept_lengths"]) == st["decoding_steps"]


@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3", "flex_attention", "paged|sdpa"])
def test_attention_without_tree_masks_is_refused_in_one_line(impl):
    model = tiny_ea_model(vocab_size=32, seed=0)
    base, head = model.base_model, model.ea_layer
    base.config._attn_implementation = impl  # as if loaded so (flash is not installed here)
    with pytest.raises(ValueError) as e:
        E.EaModel(base, head)
    msg = str(e.value)
    assert "\n" not in msg and repr(impl) in msg and "sdpa" in msg
    with pytest.raises(ValueError, match="cannot apply the tree attention mask"):
        model.eagenerate(IDS, max_new_tokens=4)  # switched after construction: refused at the call
    with pytest.raises(ValueError, match="cannot apply the tree attention mask"):
        model.tree_laws(IDS)
    base.config._attn_implementation = "sdpa"
    head.config._attn_implementation = impl
    with pytest.raises(ValueError, match="^head attention implementation"):
        E.EaModel(base, head)


def test_flex_attention_model_is_refused_at_construction():
    with pytest.raises(ValueError, match="'flex_attention' cannot apply the tree attention mask"):
        tiny_ea_model(vocab_size=32, seed=0, attn_implementation="flex_attention")


def test_tree_attention_accepted_implementations():
    from eagle.model.cpu_attention import CPU_TREE_SDPA

    for impl in (None, "eager", "sdpa", CPU_TREE_SDPA):
        E.check_tree_attention(impl)


def test_timer_records_on_the_laws_device_and_synchronises_every_device(monkeypatch):
    """CUDA paths as calls (no GPU here): events on the laws device's stream, every device synchronised."""
    recorded, synced = [], []

    class Event:
        def __init__(self, enable_timing=False):
            self.t = len(recorded)

        def record(self, stream=None):
            recorded.append(stream)

        def elapsed_time(self, other):
            return 1000.0 * (other.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream", torch.device(device)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(torch.device(device)))
    timer = E.PartTimer("cuda:1", sync_devices=(cuda("cuda", 0), cuda("cuda", 1)))
    timer.start()
    timer.lap("draft")
    timer.lap("verify")
    out = timer.result(10.0)
    assert recorded == [("stream", cuda("cuda", 1))] * 3
    assert sorted(synced, key=lambda d: d.index) == [cuda("cuda", 0), cuda("cuda", 1)]
    assert out["draft"] == out["verify"] == 1.0 and out["other"] == 8.0
