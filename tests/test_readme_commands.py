"""Every training command the README shows composes as written: its overrides name existing
groups, choices and keys (``+``/``++`` where a key is new), through real Hydra composition."""

import pathlib
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from splatloss.train import CONFIG_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "splat.md"]


def _commands():
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            joined = block.replace("\\\n", " ")
            for line in joined.splitlines():
                line = line.split("  #", 1)[0].strip()
                for prog in ("python scripts/train.py", "splatloss-train", "python -m splatloss.train", "./dev train"):
                    if line.startswith(prog):
                        found.append((doc.name, line[len(prog) :].strip()))
    return found


COMMANDS = _commands()


def test_the_docs_show_training_commands():
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize("doc,args", COMMANDS, ids=[f"{d}:{a[:60]}" for d, a in COMMANDS])
def test_training_command_composes(doc, args):
    overrides = [a for a in shlex.split(args) if a not in ("-m", "--multirun")]
    overrides = [o.replace("<date>", "2026-01-01").replace("<time>", "00-00-00") for o in overrides]
    overrides = [re.sub(r"=<[^>]*>", "=x", o) for o in overrides]  # placeholders such as <partition>
    multirun = len(overrides) != len(shlex.split(args))
    if multirun:  # a sweep: compose its first point
        overrides = [o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0] if "," in o else o for o in overrides]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    assert "loss" in cfg and "model" in cfg
