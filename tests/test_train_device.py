"""--device for the head-training route (eagle.train corpus / features / train / heldout): bad values fail
in one line naming the flag before any work; on a CUDA machine the same code runs on the GPU and matches
the CPU (those tests are skipped here and run by scripts/device_check.sh's ``head_training`` check)."""
from __future__ import annotations

import argparse

import pytest
import torch

from research import corpus as C
from eagle.train import features as Fe
from research import heldout as Ho
from eagle.train import train as T
from eagle.train.data import add_device_argument, parse_device

from test_corpus import _pool, _tiny_batch, _tiny_head, tiny  # noqa: F401  (fixture)
from test_train import tiny_base  # noqa: F401  (fixture)

CUDA = torch.cuda.is_available()
BAD = ["tpu", "cuda:x", "gpu0"] + ([] if CUDA else ["cuda", "cuda:0"])


def _parser():
    ap = argparse.ArgumentParser(prog="x")
    add_device_argument(ap, dtype=True)
    return ap


def test_parse_device_values():
    ap = _parser()
    assert parse_device(ap, "cpu") == "cpu"
    assert parse_device(ap, "auto") == ("cuda:0" if CUDA else "cpu")
    assert ap.parse_args([]).dtype == "float32"
    with pytest.raises(SystemExit):
        ap.parse_args(["--dtype", "float8"])


@pytest.mark.parametrize("value", BAD)
def test_parse_device_rejects_in_one_line_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as e:
        parse_device(_parser(), value)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--device" in err and value in err


@pytest.mark.parametrize("entry", ["corpus", "features", "train", "heldout"])
def test_every_training_cli_checks_device_before_work(entry, tmp_path, capsys):
    """A bad --device stops each CLI before it loads a model or writes anything."""
    argv = {
        "corpus": ["build", "--root", str(tmp_path / "c"), "--device", "tpu"],
        "features": ["--corpus", str(tmp_path), "--out", str(tmp_path / "f"), "--device", "tpu"],
        "train": ["--data", str(tmp_path / "none"), "--out", str(tmp_path / "h"), "--device", "tpu"],
        "heldout": ["--heads", str(tmp_path), "--device", "tpu"],
    }[entry]
    if entry == "features":  # it needs a corpus shard to get as far as --device
        (tmp_path / "shard_00000.jsonl.gz").write_bytes(b"")
    if entry == "heldout":
        (tmp_path / "config.json").write_text("{}")
    main = {"corpus": C.main, "features": Fe.main, "train": T.main, "heldout": Ho.main}[entry]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "--device" in capsys.readouterr().err
    assert not (tmp_path / "f").exists() and not (tmp_path / "h").exists() and not (tmp_path / "c" / "smollm2-135m").exists()


def test_collate_places_the_batch_on_the_device():
    seqs = [{"ids": torch.arange(5), "mask": torch.tensor([0, 0, 1, 1, 1], dtype=torch.bool),
             "hidden": torch.randn(5, 4).half()}, {"ids": torch.arange(3), "mask": torch.ones(3, dtype=torch.bool),
                                                   "hidden": torch.randn(3, 4).half()}]
    dev = "cuda" if CUDA else "cpu"
    ids, hid, mask = T.collate(seqs, [0, 1], dev)
    assert {ids.device.type, hid.device.type, mask.device.type} == {torch.device(dev).type}
    assert ids.shape == (2, 5) and hid.dtype == torch.float32 and mask[1, 3:].sum() == 0


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_unrolled_loss_on_cuda_matches_cpu():
    head = _tiny_head().train()
    ids, hid, mask, W = _tiny_batch()
    l_cpu, _ = T.unrolled_loss(head, W, ids, hid, mask, steps=3, w_tv=0.3)
    head.cuda()
    l_dev, _ = T.unrolled_loss(head, W.cuda(), ids.cuda(), hid.cuda(), mask.cuda(), steps=3, w_tv=0.3)
    torch.testing.assert_close(l_dev.cpu(), l_cpu, atol=1e-4, rtol=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(0)  # noise and CE subsets drawn on the device
    loss, _ = T.unrolled_loss(head, W.cuda(), ids.cuda(), hid.cuda(), mask.cuda(), steps=3, noise=0.1, ce_frac=0.5,
                              generator=gen)
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_features_and_train_cli_on_cuda(tiny, tmp_path):  # noqa: F811
    model, tok, folder = tiny
    C.build(C.plan(_pool(), shard_size=4), tmp_path / "run", model, tok, max_new=6, gen_batch=4, max_shards=2,
            model_name="tiny")
    common = ["--corpus", str(tmp_path / "run"), "--base", str(folder), "--threads", "1"]
    a = Fe.main(common + ["--out", str(tmp_path / "cpu"), "--device", "cpu"])
    b = Fe.main(common + ["--out", str(tmp_path / "gpu"), "--device", "cuda"])
    assert a["tokens"] == b["tokens"] and b["device"] == "cuda:0"
    from safetensors.torch import load_file

    for p in sorted((tmp_path / "cpu").rglob("*.safetensors")):
        x, y = load_file(str(p)), load_file(str(tmp_path / "gpu" / p.relative_to(tmp_path / "cpu")))
        torch.testing.assert_close(x["hidden"].float(), y["hidden"].float(), atol=2e-3, rtol=2e-3)
    log = T.main(["--base", str(folder), "--data", str(tmp_path / "gpu" / "train"), "--out", str(tmp_path / "head"),
                  "--max-steps", "8", "--lr", "3e-3", "--warmup", "2", "--batch-tokens", "512", "--val-frac", "0.3",
                  "--unroll", "2", "--eval-depths", "2", "--threads", "1", "--eval-at-start", "--device", "cuda"])
    assert log["args"]["device"] == "cuda:0" and log["eval"][-1]["loss"] < log["eval"][0]["loss"]
