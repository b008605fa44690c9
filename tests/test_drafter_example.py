"""The 'adding a drafter' example (the same text as in eagle/drafters/__init__.py's docstring) runs."""
import torch

from eagle.drafters import register_drafter, unregister_drafter
from eagle.drafting import Drafter, draft_tree_from_choices
from eagle.testing import tiny_ea_model


class RepeatLast(Drafter):
    """Proposes the root token again, `depth` times, as one chain (a point-mass law per node)."""
    name = "repeat_last"
    uses_tree = False                  # it picks its own shape; needs no head, no target features

    def __init__(self, depth: int = 3, vocab: int = 0, device="cpu"):
        self.depth, self.vocab, self.device = depth, vocab, device

    @classmethod
    def for_model(cls, model, depth: int = 3):
        return cls(depth, model.lm_head.weight.shape[0], model.device)

    def start(self, input_ids, features=None):
        pass                           # no state

    def draft(self, root, tree, rule, cfg, generator=None):
        paths = [(0,) * d for d in range(1, self.depth + 1)]                    # a chain
        tokens = {(): root, **{p: root for p in paths}}
        laws = {(0,) * d: ([root], [1.0]) for d in range(self.depth)}           # point masses
        return draft_tree_from_choices(paths, tokens, laws, self.vocab, self.device)

    def accept(self, tokens, features=None):
        pass


def test_adding_a_drafter():
    register_drafter(RepeatLast)
    try:
        model = tiny_ea_model(vocab_size=32, seed=0)
        ids = torch.tensor([[1, 2, 3, 4]])
        out = model.eagenerate(ids, temperature=0.0, max_new_tokens=20, drafter="repeat_last")
        assert torch.equal(out, model.naivegenerate(ids, temperature=0.0, max_new_tokens=20))
        a = model.eagenerate(ids, temperature=1.0, max_new_tokens=20, drafter="repeat_last", seed=1)
        assert torch.equal(a, model.eagenerate(ids, temperature=1.0, max_new_tokens=20, drafter="repeat_last", seed=1))
    finally:
        unregister_drafter("repeat_last")


def test_docstring_holds_the_same_example():
    import inspect

    import eagle.drafters

    doc = eagle.drafters.__doc__
    for line in inspect.getsource(RepeatLast).splitlines():
        assert line.strip().replace('"""', '') in doc.replace('"""', '')


def test_readme_block_runs():
    """The README's 'Drafters' python block, executed as written on a tiny model (``m``, ``ids`` given)."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("### Drafters"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    m = tiny_ea_model(vocab_size=32, seed=0)
    ids = torch.tensor([[1, 2, 3, 4]])
    ns = {"m": m, "ids": ids}
    try:
        exec(compile(block, "README.md (Drafters)", "exec"), ns)
        assert torch.equal(ns["out"], m.naivegenerate(ids, temperature=0.0, max_new_tokens=64))
    finally:
        unregister_drafter("repeat_last")
