"""Draft trees: static choices and the buffers derived from them; EAGLE-2 dynamic tree specs (:mod:`.dynamic`)."""
from .buffers import TreeBuffers, TreePlan, additive_mask, build_tree, path_to_root, subtree_parents
from .choices import MC_SIM_7B_63, balanced, chain, resolve_tree
from .dynamic import EAGLE2, DynamicTree, build_any_tree, parse_dynamic_tree
from .structure import TreeStructure, structure_of, tree_structure

__all__ = ["TreeBuffers", "TreePlan", "additive_mask", "build_tree", "path_to_root", "subtree_parents", "MC_SIM_7B_63", "balanced", "chain", "resolve_tree",
           "TreeStructure", "tree_structure", "structure_of", "EAGLE2", "DynamicTree", "build_any_tree", "parse_dynamic_tree"]
