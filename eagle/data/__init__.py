"""Files the package ships and readers of the data files it measures on.

``heads/smollm2-135m-eagle/``: the trained EAGLE-1 head of the embedded default model (config, float16
weights, draft vocabulary, held-out record, training log, model card), installed as package data so a
regular ``pip install .`` finds it (:data:`DEFAULT_HEAD`). :mod:`eagle.data.corpus` reads the
self-distillation corpus and the Alpaca prompt file (no training code).
"""
from __future__ import annotations

from importlib.resources import files

__all__ = ["HEADS", "DEFAULT_HEAD"]

#: the folder of the heads shipped with the package
HEADS = files(__name__) / "heads"
#: our trained EAGLE-1 head for the default model (public layout, float16, no embed_tokens)
DEFAULT_HEAD = str(HEADS / "smollm2-135m-eagle")
