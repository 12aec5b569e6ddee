"""The sink's memory of what is already durable."""

from processors.known_ids import KnownIds


def test_known_ids_are_rewritten_after_the_refresh_interval_and_bounded():
    known = KnownIds(limit=3, refresh_s=100)
    known.add({1, 2}, now=0)
    assert known.unseen([1, 2, 3], now=50) == {3}
    assert known.unseen([1, 2], now=101) == {1, 2}
    known.add({3, 4, 5}, now=60)
    assert known.unseen([1, 2, 3, 4, 5], now=61) == {1, 2}  # the oldest left when the bound was hit


def test_definitions_go_out_once_per_commit_and_again_after_an_abort():
    from processors.known_ids import SentDefinitions

    rec = {"stacks": [{"stack_id": 1, "frame_ids": [10, 11]}, {"stack_id": 2, "frame_ids": [11, 12]}],
           "frames": [{"frame_id": f} for f in (10, 11, 12)]}
    sent = SentDefinitions()
    first = sent.new_only(rec)
    assert [s["stack_id"] for s in first["stacks"]] == [1, 2] and len(first["frames"]) == 3
    assert sent.new_only(rec)["stacks"] == []  # pending in the same batch: not twice
    sent.abort()
    assert len(sent.new_only(rec)["stacks"]) == 2  # the aborted batch never happened
    sent.commit()
    assert sent.new_only(rec) == {**rec, "stacks": [], "frames": []}
