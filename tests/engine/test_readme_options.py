"""README's engine options table names every EngineConfig field, and nothing else."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from engine.config import EngineConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_options_table_matches_engine_config():
    text = README.read_text()
    table = text[text.index("## Engine options") :].split("\n## ")[0]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    fields = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]
    assert documented == fields
