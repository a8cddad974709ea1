"""The API examples run as written: every python block of the README's "## API" section, and of the
pages that hold the longer examples (docs/s3im.md, docs/splat.md)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE_PAGES = [ROOT / "docs" / "s3im.md", ROOT / "docs" / "splat.md"]


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _api_blocks():
    text = README.read_text()
    start = text.index("\n## API")
    end = text.find("\n## ", start + 1)
    blocks = [("README.md:API", b) for b in _python_blocks(text[start : end if end != -1 else None])]
    for page in EXAMPLE_PAGES:
        blocks += [(f"docs/{page.name}", b) for b in _python_blocks(page.read_text())]
    return blocks


def test_api_section_has_examples():
    text = README.read_text()
    start = text.index("\n## API")
    assert len(_python_blocks(text[start : text.find("\n## ", start + 1)])) >= 3


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: p.name)
def test_example_pages_have_examples(page):
    assert _python_blocks(page.read_text()), f"docs/{page.name} has no python example"


@pytest.mark.parametrize("index", range(len(_api_blocks())))  # every block, not a fixed count
def test_api_example_runs(index):
    where, block = _api_blocks()[index]
    exec(compile(block, f"{where}[{index}]", "exec"), {"__name__": "readme_example"})
