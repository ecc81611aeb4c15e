"""workers/resume.decide: where a worker resumes a partition, from Redis's watermark, never from a Kafka commit
that is ahead of it (issue 22)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.resume import decide


def test_a_watermark_wins_over_a_commit_ahead_of_it() -> None:
    r = decide(3, 41, 90, predates_watermarks=False)
    assert (r.how, r.start, r.behind) == ("state", 42, 48)
    assert "re-applying from offset 42" in r.describe()


def test_a_partition_without_a_watermark_is_read_from_its_beginning() -> None:
    """A replica that never had the partition (its tenants may be there, its watermark is not): the commit says
    records were applied, Redis holds none of them; starting at the commit would skip them for good."""
    r = decide(2, None, 84, predates_watermarks=False)
    assert (r.how, r.start, r.behind) == ("beginning", None, 84)
    assert "from its beginning" in r.describe()


def test_without_watermark_or_commit_the_partition_is_new_and_read_from_its_beginning() -> None:
    r = decide(5, None, None, predates_watermarks=False)
    assert (r.how, r.start, r.behind) == ("new", None, 0)


def test_only_a_namespace_written_before_watermarks_resumes_from_the_commit() -> None:
    r = decide(1, None, 17, predates_watermarks=True)
    assert (r.how, r.start, r.behind) == ("committed", 17, 0)


@given(st.one_of(st.none(), st.integers(0, 10**6)), st.one_of(st.none(), st.integers(0, 10**6)), st.booleans())
def test_a_resume_never_starts_after_what_redis_holds(watermark: int | None, committed: int | None,
                                                      legacy: bool) -> None:
    """The property: every record after the watermark is read again (nothing Redis lacks is skipped); only the
    pre-watermark namespace may start at the commit, the one place it is the best knowledge there is."""
    r = decide(0, watermark, committed, legacy)
    if watermark is not None:
        assert r.start == watermark + 1
    elif r.how == "committed":
        assert legacy and r.start == committed
    else:
        assert r.start is None and r.how in ("new", "beginning")
    assert r.behind >= 0
