"""peer/pipeline/robust_shares.py: a poisoned share is left out, honest replicas agree."""
import torch

from peer.pipeline.robust_shares import FACTOR, outliers


def share(scale: float, samples: int, seed: int) -> tuple[torch.Tensor, int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1000, generator=g) * 1e-3 * scale * samples, samples


def test_honest_replicas_with_uneven_samples_are_all_kept():
    shares = {"a": share(1, 1, 0), "b": share(1, 64, 1), "c": share(1, 7, 2)}
    assert all(outliers(shares, me) == set() for me in shares)


def test_a_poisoned_share_is_left_out_by_every_honest_replica_alike():
    shares = {"a": share(1, 4, 0), "b": share(1, 4, 1), "evil": (torch.full((1000,), 1e3), 4)}
    assert outliers(shares, "a") == outliers(shares, "b") == {"evil"}


def test_non_finite_or_sampleless_shares_are_left_out():
    shares = {"a": share(1, 4, 0), "b": share(1, 4, 1), "c": (torch.full((1000,), float("inf")), 4),
              "d": (torch.ones(1000), 0)}
    assert outliers(shares, "a") == {"c", "d"}


def test_two_replicas_that_disagree_far_both_leave_out_both_shares_alike():
    """Either can be the wrong one: both skip the step, and the two stay identical."""
    honest, evil = share(1, 4, 0), (torch.full((1000,), 1e3), 4)
    assert outliers({"a": honest, "evil": evil}, "a") == outliers({"a": honest, "evil": evil}, "evil") \
        == {"a", "evil"}
    assert outliers({"a": honest, "b": share(FACTOR / 2, 4, 1)}, "a") == set()
    spike = share(FACTOR * 2, 4, 1)                    # an honest loss spike on b
    assert outliers({"a": honest, "b": spike}, "a") == outliers({"a": honest, "b": spike}, "b") == {"a", "b"}
    tiny = (honest[0] * 1e-6, 4)                       # a far smaller one too: we cannot tell which is wrong
    assert outliers({"a": honest, "b": tiny}, "a") == outliers({"a": honest, "b": tiny}, "b") == {"a", "b"}
    bad = (torch.full((1000,), float("nan")), 4)       # a non-finite one is always the wrong one
    assert outliers({"a": honest, "b": bad}, "a") == outliers({"a": honest, "b": bad}, "b") == {"b"}


def test_a_replica_that_trained_nothing_judges_no_one_and_sets_no_reference():
    idle = (torch.zeros(1000), 0)
    assert outliers({"a": idle, "b": share(1, 4, 1)}, "a") == set()          # two: we cannot judge
    assert outliers({"a": share(1, 4, 0), "b": idle}, "a") == set()
    shares = {"i": idle, "j": idle, "a": share(1, 4, 0), "b": share(1, 2, 1)}
    assert outliers(shares, "a") == outliers(shares, "i") == set()           # idle ones: no reference
    shares["evil"] = (torch.full((1000,), 1e3), 4)
    assert outliers(shares, "i") == {"evil"}


def test_left_out_in_two_of_the_last_three_exchanges_bans():
    from peer.pipeline.robust_shares import LeftOutRule
    rule = LeftOutRule()
    assert rule.observe({"a", "b"}, {"b"}) == set()
    assert rule.observe({"a", "b"}, set()) == set()
    assert rule.observe({"a", "b"}, {"b"}) == {"b"} and rule.banned == {"b"}
    assert rule.observe({"a", "b"}, {"b"}) == set()            # banned once
    spread = LeftOutRule()                                       # one in three, forever: a fluke each time
    for i in range(9):
        assert spread.observe({"c"}, {"c"} if i % 3 == 0 else set()) == set()
    absent = LeftOutRule()                                       # a replica whose share did not come
    assert absent.observe(set(), {"d"}) == set() and absent.observe(set(), {"d"}) == set()


def test_ties_ban_only_when_they_keep_coming():
    """Two replicas' ties (both shares left out) are judged alike on both sides, so a tie ban is
    mutual: it takes TIE_THRESHOLD of the last TIE_WINDOW, and a tie never counts toward 2 of 3."""
    from peer.pipeline.robust_shares import TIE_THRESHOLD, TIE_WINDOW, LeftOutRule
    cluster = LeftOutRule()                              # honest spikes: clusters of ties, then calm
    pattern = [True, True, False, True] + [False] * (TIE_WINDOW - 3) + [True, False, True, True]
    for tied in pattern:
        assert cluster.observe({"b"}, {"b"} if tied else set(), tie=tied) == set()
    assert cluster.banned == set()
    run = LeftOutRule()                                  # a poisoner: every exchange a tie
    for i in range(TIE_THRESHOLD - 1):
        assert run.observe({"b"}, {"b"}, tie=True) == set()
    assert run.observe({"b"}, {"b"}, tie=True) == {"b"} and f"{TIE_THRESHOLD} of its last" in run.reason("b")
    spread = LeftOutRule()                               # ... or one that spreads them out
    banned_at = [i for i in range(4 * TIE_WINDOW) if spread.observe({"b"}, {"b"} if i % 2 == 0 else set(),
                                                                   tie=i % 2 == 0)]
    assert banned_at == [2 * (TIE_THRESHOLD - 1)]
    kinds = LeftOutRule()     # 3 ties and a broken share (a non-tie) in every 8: under each rule alone
    verdicts = ([(True, True)] * (TIE_THRESHOLD - 1) + [(True, False)] + [(False, False)] * (TIE_WINDOW - TIE_THRESHOLD)) * 4
    banned_at = [i for i, (out, tied) in enumerate(verdicts) if kinds.observe({"b"}, {"b"} if out else set(), tie=tied)]
    assert banned_at == [TIE_THRESHOLD - 1] and f"{TIE_THRESHOLD} of its last" in kinds.reason("b")
    mixed = LeftOutRule()                                # a majority's verdicts still ban at 2 of 3
    assert mixed.observe({"b", "c"}, {"b"}, tie=False) == set()
    assert mixed.observe({"b", "c"}, {"b"}, tie=False) == {"b"} and "2 of its last 3" in mixed.reason("b")
