"""An epoch its origins read too late never takes effect, and no sample is trained twice or
skipped for it: the origins keep the old epoch (peer's ScheduleBook), the coordinator sees
it in their reports (EpochUptake), and the next epoch goes on from the one they ran."""
import dataclasses

from coordinator.data_ledger import DataLedger
from coordinator.epoch_uptake import EpochUptake
from peer.pipeline.schedule_book import ScheduleBook
from tokendata.cursor import microbatch_positions, schedule_cursor

from tests.unit.tokendata.test_sample_cursor import schedule

SAMPLES = 2


def train(book: ScheduleBook, iterations, trained: list, lost=()):
    """An origin's loop: begin each iteration under the schedule it has, train its microbatches."""
    for i in iterations:
        running = book.for_iteration(i)
        book.began(i, as_origin=True)
        trained += [p for r in running.routes if (i, r.microbatch_id) not in lost
                    for p in microbatch_positions(running, SAMPLES, i, r.microbatch_id)]
    return running


def lost_then_republished(trained_until: int, start: int):
    """Epoch 1 trained iterations 0..trained_until-1 and lost microbatch 1 of iteration 1;
    epoch 2 republishes it from `start` to carry the retries."""
    ledger, uptake, book, trained = DataLedger(SAMPLES), EpochUptake(), ScheduleBook(), []
    s1 = schedule(2, start=0, **ledger.fields_for([], 0))
    book.add(s1)
    train(book, range(0, trained_until), trained, lost={(1, 1)})
    ledger.lost(s1, 1, [1])
    s2 = dataclasses.replace(s1, epoch=2, start_iteration=start, **ledger.fields_for([s1], start))
    return ledger, uptake, book, trained, [s1, s2]


def test_a_missed_epoch_is_republished_and_the_cursor_goes_on_from_the_epoch_that_ran():
    ledger, uptake, book, trained, published = lost_then_republished(trained_until=3, start=3)
    s1, s2 = published
    assert s2.data_retry == (6, 7)
    train(book, [3], trained)               # the origin began iteration 3 before it read epoch 2
    book.add(s2)
    assert book.missed(2) and book.for_iteration(3) is s1 and book.latest is s2
    assert train(book, [4, 5], trained) is s1
    assert uptake.judge(published, 3, {1}) and uptake.missed == {2} and uptake.margin_factor() == 2
    assert uptake.judge(published, 4, {1}) == []       # judged once

    s3 = dataclasses.replace(s2, epoch=3, start_iteration=6,
                             **ledger.fields_for(uptake.effective(published), 6, uptake.dropped(published)))
    published.append(s3)
    assert s3.data_retry == (6, 7) and s3.data_base == schedule_cursor(s1, SAMPLES).at(6)[0]
    book.add(s3)
    assert not book.missed(3)
    assert train(book, [6, 7], trained) is s3
    assert uptake.judge(published, 6, {3}) == [] and uptake.margin_factor() == 1
    assert len(trained) == len(set(trained)), "a sample was trained twice"
    assert sorted(trained) == list(range(len(trained))), "a sample was skipped"
    # the retries the missed epoch carried went to epoch 3, which trained them: not again
    s4 = dataclasses.replace(s3, epoch=4, start_iteration=8,
                             **ledger.fields_for(uptake.effective(published), 8, uptake.dropped(published)))
    assert s4.data_retry == ()


def test_an_epoch_some_origins_missed_is_published_again_but_still_counts():
    uptake = EpochUptake()
    s1, s2 = schedule(2, start=0), schedule(2, start=3, epoch=2)
    assert uptake.judge([s1, s2], 3, {1, 2}) and uptake.missed == set()
    assert uptake.effective([s1, s2]) == [s1, s2]


def test_a_non_origin_takes_a_new_epoch_whenever_it_reads_it():
    book = ScheduleBook()
    s1, s2 = schedule(2, start=0), schedule(2, start=3, epoch=2)
    book.add(s1)
    book.add(s2)                            # nothing begun as an origin: never missed
    assert book.for_iteration(3) is s2 and not book.missed(2)


def test_no_epoch_is_published_on_top_of_one_whose_uptake_is_unknown():
    """Seen in CI: a re-plan from iteration 21 and, 13 ms later, a republish from 22 that went
    on from the re-plan's cursor; the origins missed the re-plan, so iteration 23 trained what
    iteration 21 had. The republish now waits until iteration 21 says which epoch ran."""
    from types import SimpleNamespace
    from coordinator.published import PublishedSchedules
    ledger, published = DataLedger(SAMPLES), PublishedSchedules(lambda i: {})
    s1 = schedule(2, start=0, **ledger.fields_for([], 0))
    published.add(s1)
    published.judge(0, {"o0": SimpleNamespace(epoch=1)})
    replan = schedule(2, start=21, epoch=3, **published.data_fields(ledger, 21))
    published.add(replan)
    assert not published.awaits_uptake(20) and published.awaits_uptake(22)
    assert published.judge(21, {"o0": SimpleNamespace(epoch=1), "o1": SimpleNamespace(epoch=1)})
    assert not published.awaits_uptake(22)
    republish = schedule(2, start=22, epoch=4, **published.data_fields(ledger, 22))
    assert republish.data_base == schedule_cursor(s1, SAMPLES).at(22)[0]
    assert published.ran_under(21) is s1 and published.ran_under(22) is s1


def test_a_split_epoch_is_published_again_at_once_superseding_a_re_plan_far_ahead():
    """Seen in bench/faults.py: epoch 2 from 17 split (one origin kept epoch 1, non-origins took
    2 and refused its work); a re-plan, epoch 3, was out from 31. The republish waited for
    epoch 3's uptake, so the swarm lost microbatches until iteration 31 (2.5 minutes). It now
    goes out from the next safe start and supersedes epoch 3, which never runs."""
    from types import SimpleNamespace
    from coordinator.published import PublishedSchedules
    from coordinator.replanner import republish_start
    ledger, published = DataLedger(SAMPLES), PublishedSchedules(lambda i: {})
    s1 = schedule(2, start=0, **ledger.fields_for([], 0))
    published.add(s1)
    published.judge(0, {"o0": SimpleNamespace(epoch=1), "o1": SimpleNamespace(epoch=1)})
    s2 = dataclasses.replace(s1, epoch=2, start_iteration=17, **published.data_fields(ledger, 17))
    published.add(s2)
    far = dataclasses.replace(s2, epoch=3, start_iteration=31, **published.data_fields(ledger, 31))
    published.add(far)
    assert published.judge(17, {"o0": SimpleNamespace(epoch=1), "o1": SimpleNamespace(epoch=2)})   # split
    start = republish_start(19, far.start_iteration)
    assert start == 19 and not published.awaits_uptake(start)
    assert published.awaits_uptake(republish_start(33, far.start_iteration))  # past it: wait for its uptake
    again = dataclasses.replace(far, epoch=4, start_iteration=start, **published.data_fields(ledger, start))
    assert again.data_base == schedule_cursor(s2, SAMPLES).at(19)[0]   # goes on from the split epoch
    books = {o: ScheduleBook() for o in ("o0", "o1", "p")}
    for name, book in books.items():
        book.add(s1)
        train(book, range(0, 17), [])
    books["o1"].add(s2)
    for book in books.values():     # o0 read epoch 2 only after it began 17 (it keeps epoch 1)
        train(book, [17], [])
        book.add(s2)
        book.add(far)
        train(book, [18], [])
        book.add(again)
    assert all(book.for_iteration(i) is again for book in books.values() for i in (19, 31, 40))
    assert republish_start(20, 20) == 21 and republish_start(25, 20) == 25


def test_a_non_origin_keeps_the_origins_epoch_when_a_new_one_starts_in_its_past():
    """Seen in CI: with the DHT slow, epoch 3 was published from iteration 28 while the swarm was
    at 55; the origins kept epoch 2 (missed), the other stages took epoch 3 and refused their
    work. A non-origin now takes such an epoch only once work of it shows the origins did."""
    book = ScheduleBook()
    s2, s3 = schedule(2, start=21, epoch=2), schedule(2, start=28, epoch=3)
    book.add(s2)
    book.began(55, as_origin=False)
    book.add(s3)
    assert book.latest is s3 and not book.missed(3)
    assert book.for_iteration(55) is s2 and book.for_iteration(56) is s2
    book.follow(2, 55)
    assert book.for_iteration(56) is s2
    book.follow(3, 27)                      # not an iteration epoch 3 covers: proves nothing
    assert book.for_iteration(56) is s2
    book.follow(3, 56)                      # the origins run it after all
    assert book.for_iteration(56) is s3


def test_a_non_origin_takes_an_epoch_read_before_it_began_the_epochs_first_iteration():
    book = ScheduleBook()
    book.add(schedule(2, start=0))
    book.began(27, as_origin=False)
    s3 = schedule(2, start=28, epoch=3)
    book.add(s3)
    assert book.for_iteration(28) is s3


def test_an_epoch_skipped_while_stopped_is_taken_when_read_later():
    """bench/faults.py: a peer stopped through a pulled-in epoch (3, from 30) knew 2 (from 33) and
    read 4 next; without 3 it served iterations 30-32 under epoch 1 and refused the origins' work."""
    book = ScheduleBook()
    s1, s2, s3, s4 = (schedule(2, start=start, epoch=e) for e, start in ((1, 0), (2, 33), (3, 30), (4, 42)))
    book.add(s1)
    book.add(s2)
    book.began(26, as_origin=False)
    book.add(s4)
    assert book.for_iteration(31) is s1
    assert book.add_skipped(s3)
    # epoch 3 replaced 2 (the same routes from sooner): 2 never runs
    assert book.latest is s4 and [book.for_iteration(i) for i in (29, 31, 34, 42)] == [s1, s3, s3, s4]
    assert not book.add_skipped(s3) and not book.add_skipped(s4)           # known, or not older
    assert not book.add_skipped(schedule(2, start=0, epoch=0))              # older than anything we keep


def test_a_skipped_epoch_whose_start_we_passed_as_an_origin_is_missed():
    book = ScheduleBook()
    book.add(schedule(2, start=0, epoch=1))
    book.began(31, as_origin=True)
    book.add(schedule(2, start=42, epoch=4))
    s3 = schedule(2, start=30, epoch=3)
    assert book.add_skipped(s3) and book.missed(3)
    assert book.for_iteration(31).epoch == 1       # we began 30 and 31 under epoch 1: kept


def test_retries_a_missed_re_plan_took_over_from_an_epoch_that_ran_are_not_carried_again():
    """Seen in the dataset swarm test (CI, loaded box): epoch 2 republished to carry iteration 1's
    lost samples from iteration 6; a re-plan (epoch 3) from iteration 4 took them over, and the
    origins missed it, so epoch 2 ran and trained them at 6. The republish of epoch 3 left them
    out (epoch 2, covering it, had them), but every later epoch carried them again from the
    missed one: trained twice."""
    ledger, uptake, book, trained, published = lost_then_republished(trained_until=2, start=6)
    s1, s2 = published
    book.add(s2)
    s3 = dataclasses.replace(s1, epoch=3, start_iteration=4, **ledger.fields_for(published, 4))
    published.append(s3)
    assert s2.data_retry == s3.data_retry == (6, 7)
    train(book, range(2, 5), trained)       # began iteration 4 before it read epoch 3
    book.add(s3)
    assert book.missed(3)
    assert train(book, range(5, 8), trained) is s2
    assert uptake.judge(published, 4, {1}) and uptake.missed == {3}
    assert uptake.judge(published, 6, {2}) == []
    s4 = dataclasses.replace(s3, epoch=4, start_iteration=8,
                             **ledger.fields_for(uptake.effective(published), 8, uptake.dropped(published)))
    published.append(s4)
    assert s4.data_retry == ()
    book.add(s4)
    train(book, range(8, 10), trained, lost={(9, 0)})
    ledger.lost(s4, 9, [0])
    s5 = dataclasses.replace(s4, epoch=5, start_iteration=10,
                             **ledger.fields_for(uptake.effective(published), 10, uptake.dropped(published)))
    published.append(s5)
    book.add(s5)
    train(book, range(10, 12), trained)
    assert len(trained) == len(set(trained)), "a sample was trained twice"
    assert sorted(trained) == list(range(len(trained))), "a sample was skipped"
