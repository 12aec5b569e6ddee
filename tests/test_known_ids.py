"""The sink's memory of what is already durable."""

from processors.known_ids import KnownIds


def test_known_ids_are_rewritten_after_the_refresh_interval_and_bounded():
    known = KnownIds(limit=3, refresh_s=100)
    known.add({1, 2}, now=0)
    assert known.unseen([1, 2, 3], now=50) == {3}
    assert known.unseen([1, 2], now=101) == {1, 2}
    known.add({3, 4, 5}, now=60)
    assert known.unseen([1, 2, 3, 4, 5], now=61) == {1, 2}  # the oldest left when the bound was hit
