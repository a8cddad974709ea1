"""The README's API examples run as written (every python block of the "## API" section)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _api_blocks():
    text = README.read_text()
    start = text.index("\n## API")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else None]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_api_section_has_examples():
    assert len(_api_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(_api_blocks())))  # every block, not a fixed count
def test_api_example_runs(index):
    blocks = _api_blocks()
    exec(compile(blocks[index], f"README.md:API[{index}]", "exec"), {"__name__": "readme_example"})
