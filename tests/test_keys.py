"""``bounded_key``: keys rendered from client data fit what every store accepts."""

from __future__ import annotations

from ratekeeper.keys import DIGEST_MARK, bounded_key
from ratekeeper.rule import MAX_KEY_LENGTH


def test_a_key_within_the_bound_is_itself() -> None:
    assert "tenant:42" == bounded_key("tenant:42")
    exact = "k" * MAX_KEY_LENGTH
    assert exact == bounded_key(exact)


def test_a_longer_key_keeps_a_prefix_and_a_digest_of_the_whole() -> None:
    long_one = "Bearer " + "a" * 5000 + "1"
    long_two = "Bearer " + "a" * 5000 + "2"
    bounded = bounded_key(long_one)
    assert MAX_KEY_LENGTH == len(bounded)
    assert bounded.startswith("Bearer aaa") and DIGEST_MARK in bounded
    assert bounded == bounded_key(long_one)  # stable: the same client keeps its budget
    assert bounded != bounded_key(long_two)  # a shared prefix is not a shared budget
    assert MAX_KEY_LENGTH == len(bounded_key("é" * 600 + "\ud800"))  # any text, even a lone surrogate
