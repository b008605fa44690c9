"""Drafter plug-ins through the entry-point group ``univer_eagle.drafters`` (eagle imports them by no name)."""
import textwrap

import pytest

from eagle.drafters import ENTRY_POINT_GROUP, available_drafters, get_drafter, register_drafter, unregister_drafter
from eagle.drafters import registry


def test_entry_point_plugin_is_loaded(tmp_path, monkeypatch):
    (tmp_path / "fake_drafter_plugin.py").write_text(textwrap.dedent('''
        from eagle.drafters import PromptLookupDrafter, register_drafter

        class Fake(PromptLookupDrafter):
            name = "fake_plugin_lookup"

        register_drafter(Fake)
    '''))
    dist = tmp_path / "fake_drafter_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake_drafter_plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfake = fake_drafter_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)
    try:
        assert ENTRY_POINT_GROUP == "univer_eagle.drafters"
        assert "fake_plugin_lookup" in available_drafters()
        assert get_drafter("fake_plugin_lookup").name == "fake_plugin_lookup"
    finally:
        unregister_drafter("fake_plugin_lookup")


def test_register_refuses_bad_entries():
    with pytest.raises(ValueError, match="Drafter subclass"):
        register_drafter(object)
    from eagle.drafters import PromptLookupDrafter

    class Clash(PromptLookupDrafter):
        name = "prompt_lookup"

    with pytest.raises(ValueError, match="already registered"):
        register_drafter(Clash)
