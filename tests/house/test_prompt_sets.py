"""The benchmarks' prompt sets by name (benchmarks/prompt_sets.py): `A+B` alternates two sets, `mixed`
is `rewrite+chat` as it was, and `hex` is the same text on every machine."""

from __future__ import annotations

from benchmarks.prompt_sets import prompt_set


def test_two_sets_alternate_a_shorter_one_repeated():
    rewrite, hexes = prompt_set("rewrite", 5), prompt_set("hex", 5)
    assert len(rewrite) == 2 and len(hexes) == 5
    assert prompt_set("rewrite+hex", 5) == [rewrite[0], hexes[0], rewrite[1], hexes[1], rewrite[0], hexes[2],
                                            rewrite[1], hexes[3], rewrite[0], hexes[4]]
    assert prompt_set("mixed", 3) == prompt_set("rewrite+chat", 3)
    assert prompt_set("mixed", 3)[1::2] == prompt_set("chat", 3)


def test_hex_is_seeded_random_digits():
    hexes = prompt_set("hex", 3)
    assert hexes == prompt_set("hex", 3) and len(set(hexes)) == 3
    assert hexes[0].startswith("d82c07cd 629f6fbe ")
    assert all(len(h.split()) == 40 and all(len(w) == 8 and int(w, 16) >= 0 for w in h.split()) for h in hexes)
