"""Reading an instructor's answer key (docs/answers/NN_name.md) in the answer tests.

A key states its numeric answers on lines `**Answer N:** ...`; a test reads
one with `key.answer(N)`, pulls its numbers with `numbers(text)`, and checks
them against its own computation.
"""

import re
from pathlib import Path

ANSWERS = Path(__file__).resolve().parents[1] / "docs" / "answers"


class AnswerKey:
    def __init__(self, name: str):
        self.path = ANSWERS / f"{name}.md"

    def answer(self, n: int) -> str:
        """The text after `**Answer n:**` in the key."""
        found = re.search(rf"^\*\*Answer {n}:\*\*(.*)$", self.path.read_text(encoding="utf-8"), re.M)
        assert found, f"no '**Answer {n}:**' line in {self.path}"
        return found.group(1).strip()


def numbers(text: str) -> list[float]:
    """Every number in `text`, thousands separators allowed: '46,080 B, 0.6 %' -> [46080.0, 0.6]."""
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", text)]
