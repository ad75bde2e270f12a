"""docs/api.md's settings table and signatures are made from the settings' declarations
(``engine/loading/settings.py``): this fails while they differ; ``python -m engine.datamodule.settings_doc``
rewrites them."""

from __future__ import annotations

from engine.datamodule import settings_doc
from engine.loading.settings import SETTINGS


def test_docs_api_md_shows_the_declarations():
    text = settings_doc.API_DOC.read_text(encoding="utf-8")
    assert sorted(match["name"] for match in settings_doc.REGION.finditer(text)) == sorted(settings_doc.PARTS)
    assert settings_doc.render(text) == text, (
        "docs/api.md's generated parts differ from the settings' declarations in engine/loading/settings.py; run "
        "python -m engine.datamodule.settings_doc")


def test_every_setting_has_a_row_with_its_default_and_doc():
    text = "\n".join(settings_doc.settings_table())
    for setting in SETTINGS:
        assert f"| `{setting.name}` | " in text and setting.doc.replace("|", "\\|") in text


def test_a_changed_row_is_made_again_and_other_text_is_kept(tmp_path):
    text = settings_doc.API_DOC.read_text(encoding="utf-8")
    drifted = text.replace("| `num_workers` | `int` | `0` |", "| `num_workers` | `int` | `4` |")
    assert drifted != text and settings_doc.render(drifted) == text
    target = tmp_path / "api.md"
    target.write_text(drifted, encoding="utf-8")
    settings_doc.API_DOC, original = target, settings_doc.API_DOC
    try:
        assert settings_doc.main(["--check"]) == 1 and target.read_text(encoding="utf-8") == drifted
        assert settings_doc.main([]) == 0 and target.read_text(encoding="utf-8") == text
    finally:
        settings_doc.API_DOC = original


def test_signature_lines_fit_the_page():
    assert all(len(line) <= settings_doc.WIDTH for line in settings_doc.module_signature())
    assert all(len(line) <= settings_doc.WIDTH for line in settings_doc.config_signature())
