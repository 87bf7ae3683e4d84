"""Each exercise's one-sentence takeaway (takeaways.yaml): the end of a passed guided run, and the
exercise's page in the docs."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

TAKEAWAYS = Path(__file__).with_name("takeaways.yaml")


@lru_cache(maxsize=1)
def takeaways() -> dict[str, str]:
    """The takeaway of each exercise, by the exercise's name."""
    return yaml.safe_load(TAKEAWAYS.read_text(encoding="utf-8"))
