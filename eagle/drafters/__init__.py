"""Drafters: the registry and the built-in drafters (``eagle``, ``prompt_lookup``, ``hybrid`` = the head's tree
with a prompt-lookup chain mixed in).
``draft_lm``: a separate draft language model sharing the target's tokenizer (:mod:`.draft_lm`).
``eagle3``: a public EAGLE-3 head (fused target layers, draft vocabulary), ``drafter_options={"path": folder}`` (:mod:`.eagle3`).

Adding a drafter (the example that ``tests/test_drafter_example.py`` runs)::

    import torch
    from eagle.drafting import Drafter, draft_tree_from_choices
    from eagle.drafters import register_drafter
    from eagle.testing import tiny_ea_model

    class RepeatLast(Drafter):
        \"\"\"Proposes the root token again, `depth` times, as one chain (a point-mass law per node).\"\"\"
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

    register_drafter(RepeatLast)
    model = tiny_ea_model(vocab_size=32, seed=0)
    ids = torch.tensor([[1, 2, 3, 4]])
    out = model.eagenerate(ids, temperature=0.0, max_new_tokens=20, drafter="repeat_last")
    assert torch.equal(out, model.naivegenerate(ids, temperature=0.0, max_new_tokens=20))
"""
from ..drafting import Drafter, DraftTree, EagleTreeDrafter, draft_tree_from_choices
from .draft_lm import DraftLMDrafter
from .hybrid import HybridDrafter
from .prompt_lookup import PromptLookupDrafter
from .eagle3 import Eagle3Drafter
from .registry import (ENTRY_POINT_GROUP, available_drafters, get_drafter, make_drafter, register_drafter,
                       unregister_drafter)

__all__ = ["Drafter", "DraftTree", "EagleTreeDrafter", "PromptLookupDrafter", "HybridDrafter", "draft_tree_from_choices",
           "ENTRY_POINT_GROUP", "register_drafter", "unregister_drafter", "get_drafter", "available_drafters",
           "make_drafter"]

register_drafter(EagleTreeDrafter)
register_drafter(PromptLookupDrafter)
register_drafter(Eagle3Drafter)
register_drafter(HybridDrafter)
register_drafter(DraftLMDrafter)
