"""The default model's one-time conversion is published safely when two processes race to make it."""
import pytest

from eagle.model.default import publish_folder


def _folder(p, text):
    p.mkdir()
    (p / "config.json").write_text(text)
    return p


def test_publish_renames_when_first(tmp_path):
    out = publish_folder(_folder(tmp_path / "m.tmp1", "a"), tmp_path / "m")
    assert (out / "config.json").read_text() == "a" and not (tmp_path / "m.tmp1").exists()


def test_publish_keeps_the_winner_when_second(tmp_path):
    _folder(tmp_path / "m", "winner")
    (tmp_path / "m" / "model.safetensors").write_text("w")  # a finished folder is not empty: rename fails
    out = publish_folder(_folder(tmp_path / "m.tmp2", "loser"), tmp_path / "m")
    assert (out / "config.json").read_text() == "winner" and not (tmp_path / "m.tmp2").exists()


def test_publish_raises_when_target_is_not_a_finished_conversion(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "junk").write_text("x")
    with pytest.raises(OSError):
        publish_folder(_folder(tmp_path / "m.tmp3", "a"), tmp_path / "m")
