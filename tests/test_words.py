"""The one plural of jaxwarm's lines (jaxwarm.core.words)."""

from __future__ import annotations

from jaxwarm.core.words import plural
from jaxwarm.job.ranks import ranks_of


def test_plural_says_one_and_many() -> None:
    assert [plural(n, "entry", "entries") for n in (0, 1, 2)] == ["entries", "entry", "entries"]
    assert plural(1, "key") == "key" and plural(3, "key") == "keys"
    assert plural(1, "is", "are") == "is" and plural(2, "it", "them") == "them"
    assert ranks_of([3]) == "rank 3" and ranks_of([0, 1, 2, 3]) == "ranks 0-3"
