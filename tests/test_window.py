"""The prefetch window on its own, driving a fake backend in this thread: no workers, no timing luck."""

import itertools
import time
from typing import ClassVar

import pytest

import lazyseq
from lazyseq.core.node import Exhausted
from lazyseq.errors import PrefetchTimeout
from lazyseq.evaluation import window as window_module
from lazyseq.evaluation import wire
from lazyseq.evaluation.backend import Result
from lazyseq.evaluation.window import Window


class FakeBackend:
    """Answers every job at the next poll, computing ``seq[i]`` here, unless told to hold it.

    ``hold(r)``: the job of items ``r`` never answers. ``slots``: jobs it takes before it refuses
    (None: no limit); an answered job gives its slot back. ``cap``: its chunk_cap."""

    COUNTERS: ClassVar[dict] = {}
    JOB_SECONDS = 0.004

    def __init__(self, seq, hold=lambda r: False, slots=None, cap=None, item_seconds=1e-5):
        self.seq, self.hold, self.slots, self.cap, self.item_seconds = seq, hold, slots, cap, item_seconds
        self.pending: dict[int, range] = {}
        self.submitted: list[tuple[int, range, bool]] = []
        self.cancelled: list[set[int]] = []
        self.refused = 0

    def submit(self, job_id, r, wanted):
        if self.slots is not None and len(self.pending) >= self.slots:
            self.refused += 1
            return False
        self.pending[job_id] = r
        self.submitted.append((job_id, r, wanted))
        return True

    def cancel(self, job_ids):
        self.cancelled.append(set(job_ids))
        gone = {j for j in job_ids if not self.hold(self.pending[j])}
        for j in gone:  # not started: never answers
            del self.pending[j]
        return gone

    def poll(self, timeout):
        out = []
        time.sleep(min(timeout, 0.001))  # a real backend waits for answers
        for job_id, r in list(self.pending.items()):
            if self.hold(r):
                continue
            del self.pending[job_id]
            out.append(Result(job_id, wire.evaluate(self.seq, r, portable=False), self.item_seconds * len(r)))
        return out

    def check(self):
        pass

    def room(self):
        return self.slots is None or len(self.pending) < self.slots

    def started(self, job_id):
        return True

    def where(self, job_id):
        return None

    def chunk_cap(self, item_bytes):
        return self.cap

    def gauges(self):
        return {}

    def in_flight(self):
        return len(self.pending)


def make(seq, backend=None, nworkers=2, max_buffered=4, timeout=None, **kwargs):
    backend = backend or FakeBackend(seq, **kwargs)
    stats = dict(Window.COUNTERS)
    return Window(seq, backend, nworkers, max_buffered, timeout, stats, "test window"), backend


def indices(backend):
    return [i for _, r, _ in backend.submitted for i in r]


def test_reading_in_order_gives_every_item_once_and_chunks_grow():
    seq = lazyseq.smap(lambda x: x * 10, range(2000))
    w, b = make(seq)
    assert [w.read(i) for i in range(2000)] == [x * 10 for x in range(2000)]
    assert sorted(indices(b)) == list(range(2000))  # each item computed once
    sizes = [len(r) for _, r, _ in b.submitted]
    assert sizes[0] == 1 and max(sizes) > 64  # grown from one item while jobs came back fast
    assert w.stats["items"] == 2000 and w.stats["jumps"] == 0


def test_jobs_in_flight_never_exceed_max_buffered():
    seq = lazyseq.smap(lambda x: x, range(500))
    b = FakeBackend(seq)
    most = [0]
    real = b.submit

    def counting(job_id, r, wanted):
        ok = real(job_id, r, wanted)
        most[0] = max(most[0], len(b.pending))
        return ok

    b.submit = counting
    w, _ = make(seq, b, max_buffered=3)
    for i in range(500):
        assert w.read(i) == i
    assert most[0] == 3


def test_chunks_stay_within_what_the_backend_can_carry():
    seq = lazyseq.smap(lambda x: x, range(300))
    w, b = make(seq, cap=5)
    for i in range(300):
        w.read(i)
    assert max(len(r) for _, r, _ in b.submitted) == 5


def test_a_jump_gives_up_jobs_no_longer_wanted_and_keeps_the_others():
    seq = lazyseq.smap(lambda x: x, range(10_000))
    w, b = make(seq, hold=lambda r: 100 <= r[0] < 5000)  # the window ahead of 100 stays in flight
    for i in range(100):
        w.read(i)
    assert b.pending
    ahead = dict(b.pending)
    assert w.read(7000) == 7000
    assert w.stats["jumps"] == 1
    given_up = set().union(*b.cancelled)
    assert given_up == set(ahead)  # everything between 100 and the old horizon is stale
    assert all(7000 not in r for r in ahead.values())


def test_a_jump_back_inside_the_window_keeps_the_jobs_in_flight():
    seq = lazyseq.smap(lambda x: x, range(10_000))
    w, b = make(seq, hold=lambda r: r[0] >= 40)  # nothing from 40 on comes back until we say so
    for i in range(30):
        w.read(i)
    in_flight = dict(b.pending)
    assert any(r[0] >= 40 for r in in_flight.values())
    b.hold = lambda r: False
    assert w.read(35) == 35  # within the window: a jump, but the jobs past 35 are still wanted
    given_up = set().union(*b.cancelled)
    assert all(in_flight[j][-1] < 35 for j in given_up)  # only jobs wholly behind the reader
    assert [w.read(i) for i in range(36, 200)] == list(range(36, 200))
    assert all(indices(b).count(i) == 1 for i in range(40, 200))  # what was in flight is not scheduled again


def test_a_reader_walking_with_a_stride_gets_jobs_with_that_stride():
    seq = lazyseq.smap(lambda x: x, range(100_000))
    w, b = make(seq)
    for i in range(0, 50_000, 7):
        assert w.read(i) == i
    steps = [r.step for _, r, _ in b.submitted]
    assert len(steps) > 8 and set(steps[8:]) == {7}  # step 1 only until the stride shows twice
    assert w.stats["jumps"] <= 3
    assert len(indices(b)) < 2 * len(range(0, 50_000, 7))  # not the items in between


def test_a_refusing_backend_makes_the_window_wait_not_fail():
    seq = lazyseq.smap(lambda x: x, range(300))
    w, b = make(seq, slots=1, max_buffered=8)
    assert [w.read(i) for i in range(300)] == list(range(300))
    assert b.refused > 0


def test_an_item_that_never_arrives_times_out_naming_it():
    seq = lazyseq.smap(lambda x: x, range(100))
    w, _b = make(seq, hold=lambda r: 3 in r, cap=1, timeout=0.05)  # one item per job
    assert [w.read(i) for i in range(3)] == [0, 1, 2]
    with pytest.raises(lazyseq.PrefetchTimeout, match=r"item 3 did not arrive within timeout=0.05s \(test window\)"):
        w.read(3)
    assert w.read(4) == 4  # the window goes on


def test_a_held_up_chunk_lets_its_other_items_through_on_their_own(monkeypatch):
    monkeypatch.setattr(window_module, "_LATE_FLOOR", 0.01)
    seq = lazyseq.smap(lambda x: x, range(1000))
    w, b = make(seq, cap=4)  # (each later item of a held-up job waits _PATIENCE: keep them few)
    for i in range(100):
        w.read(i)
    holder = max(b.pending.values(), key=len)  # a job ahead, not yet answered
    assert len(holder) > 1 and holder[0] > 100
    b.hold = lambda r: holder[0] in r  # its first item gets stuck
    for i in range(100, holder[0]):
        assert w.read(i) == i
    after = holder[1]
    assert w.read(after) == after  # skipping the stuck one: once its job is late, it goes on alone
    assert range(after, after + 1) in [r for _, r, _ in b.submitted]
    assert [w.read(i) for i in range(after + 1, 400)] == list(range(after + 1, 400))


def test_a_source_of_unknown_size_ends_where_the_workers_find_its_end():
    seq = lazyseq.uniter(iter(range(25)))
    w, _b = make(seq)
    got = []
    for i in itertools.count():
        value = w.read(i)
        if type(value) is wire.ItemError:
            assert isinstance(value.error, Exhausted) and i == 25
            break
        got.append(value)
    assert got == list(range(25))
    assert w.end == 25


class StuckBackend(FakeBackend):
    """A worker gets stuck inside item ``stuck``: the job holding it answers the items before it
    in a part, then nothing; ``where`` says the worker is in that item (and, for the jobs queued
    behind it on that worker, in an earlier job) since it got there."""

    def __init__(self, seq, stuck, **kwargs):
        super().__init__(seq, **kwargs)
        self.stuck, self.stuck_job, self.since, self.parted = stuck, None, None, False
        self.queued_behind = set()  # jobs sent to the stuck worker before it was given up

    def submit(self, job_id, r, wanted):
        ok = super().submit(job_id, r, wanted)
        if ok and self.stuck in r and self.stuck_job is None:
            self.stuck_job = job_id
        elif ok and self.stuck_job is not None and job_id % 2 == self.stuck_job % 2 \
                and not any(self.stuck_job in c for c in self.cancelled):  # a given-up worker gets no more jobs
            self.queued_behind.add(job_id)
        return ok

    def poll(self, timeout):
        out = []
        time.sleep(min(timeout, 0.001))
        for job_id, r in list(self.pending.items()):
            if job_id == self.stuck_job:
                if not self.parted:
                    self.parted, self.since = True, time.monotonic()
                    before = r[: r.index(self.stuck)]
                    out.append(Result(job_id, wire.evaluate(self.seq, before, portable=False), final=False))
                continue
            if job_id in self.queued_behind:
                continue  # queued behind the stuck job on the same worker
            del self.pending[job_id]
            out.append(Result(job_id, wire.evaluate(self.seq, r, portable=False), self.item_seconds * len(r)))
        return out

    def cancel(self, job_ids):
        self.cancelled.append(set(job_ids))
        gone = {j for j in job_ids if j != self.stuck_job and j in self.pending}
        for j in gone:
            del self.pending[j]
        return gone

    def where(self, job_id):
        if self.since is None or job_id not in self.pending:
            return None
        if job_id == self.stuck_job:
            return self.stuck, self.since
        if job_id in self.queued_behind:
            return None, self.since
        return None


def test_a_stuck_item_holds_up_only_itself_and_is_never_given_to_a_second_worker():
    seq = lazyseq.smap(lambda x: x, range(3000))
    b = StuckBackend(seq, stuck=700)
    w, _ = make(seq, b, timeout=0.5)
    for i in range(3000):
        if i == 700:
            with pytest.raises(PrefetchTimeout, match="item 700"):
                w.read(i)
        else:
            assert w.read(i) == i
    with pytest.raises(PrefetchTimeout, match="item 700"):
        w.read(700)  # again: still not duplicated
    assert sum(700 in r for _, r, _ in b.submitted) == 1
    assert w.stats["moved"] >= 1  # what waited behind it went elsewhere
    assert sorted(set(indices(b))) == list(range(3000))
