"""Property tests: random compositions of views against the same operations on plain lists.

A pipeline is built over a source list of distinct items together with a model: ``pos``, the source
position every item of the view reads. Reads must give ``[src[p] for p in pos]`` under any key a list
accepts (plus index arrays and boolean masks, as numpy); writes must change ``src`` exactly as
writing the positions selected by the same key would.
"""

from __future__ import annotations

import itertools
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lazyseq as ls

_SCALE = float(os.environ.get("LAZYSEQ_TEST_SCALE", "1"))  # e.g. 20 for a long bug hunt
SETTINGS = settings(max_examples=int(150 * _SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=int(60 * _SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- list-side reference ---------------------------------------------------------------------------
class Err:
    """The exception type a list operation raised (compared by type)."""

    def __init__(self, exc: type[BaseException]):
        self.exc = exc

    def __repr__(self) -> str:
        return f"Err({self.exc.__name__})"


def ref_get(ref: list, key):
    """What ``ref[key]`` gives, with numpy's meaning for index arrays and boolean masks."""
    if isinstance(key, (int, np.integer)):
        try:
            return ref[key]
        except IndexError:
            return Err(IndexError)
    if isinstance(key, slice):
        try:
            return ref[key]
        except ValueError:
            return Err(ValueError)
    arr = np.asarray(key)
    if arr.dtype == bool:
        if len(arr) != len(ref):
            return Err(IndexError)
        return [x for x, m in zip(ref, arr) if m]
    out = []
    for k in arr.tolist():
        if not -len(ref) <= k < len(ref):
            return Err(IndexError)
        out.append(ref[k])
    return out


def view_get(view, key):
    try:
        got = view[key]
    except (IndexError, ValueError) as e:
        return Err(type(e))
    if isinstance(key, (int, np.integer)):
        return got
    assert isinstance(got, ls.View), f"{type(key).__name__} key gave {type(got).__name__}, not a view"
    return list(got)


def same(a, b) -> bool:
    if isinstance(a, Err) or isinstance(b, Err):
        return isinstance(a, Err) and isinstance(b, Err) and a.exc is b.exc
    return a == b


def interleave_ref(*lists: list) -> list:
    its, out = [iter(x) for x in lists], []
    while its:
        alive = []
        for it in its:
            for x in itertools.islice(it, 1):
                out.append(x)
                alive.append(it)
        its = alive
    return out


# -- keys ------------------------------------------------------------------------------------------
def slices(m: int):
    bound = st.none() | st.integers(-m - 3, m + 3)
    return st.builds(slice, bound, bound, st.none() | st.integers(-4, 4).filter(bool))


def keys(m: int, allow_bad: bool = True):
    """Every kind of key a view accepts; out-of-range ones included when ``allow_bad``."""
    lo, hi = (-m - 3, m + 2) if allow_bad else (-m, m - 1)
    ints = st.integers(lo, hi) if m or allow_bad else st.nothing()
    idx = st.lists(st.integers(lo, hi), max_size=40) if m or allow_bad else st.just([])
    return st.one_of(
        st.just(slice(None, None, 0)) if allow_bad else st.nothing(),
        ints,
        ints.map(np.int64),
        slices(m),
        idx,
        idx.map(lambda x: np.array(x, dtype=np.int64)),
        idx.map(lambda x: np.array(x, dtype=np.int32)),
        idx.map(lambda x: np.array([i for i in x if i >= 0], dtype=np.uint16)),
        st.lists(st.booleans(), min_size=m, max_size=m).map(lambda x: np.array(x, dtype=bool)),
        st.integers(0, m).map(lambda k: range(k)),
    )


# -- pipelines -------------------------------------------------------------------------------------
def sub(view, key):
    """``view[key]`` as a view, even when ``view`` is the plain source list."""
    return (view if isinstance(view, ls.View) else ls.gather(view, range(len(view))))[key]


def st_gather(draw, view, pos):
    m = len(pos)
    idx = draw(st.lists(st.integers(-m, m - 1), max_size=30)) if m else []
    if draw(st.booleans()):
        idx = np.array(idx, dtype=np.int64)
    fn = draw(st.sampled_from([ls.gather, ls.take]))
    return fn(view, idx), [pos[j] for j in idx]


def st_slice(draw, view, pos):
    key = draw(slices(len(pos)))
    return sub(view, key), pos[key]


def st_index_list(draw, view, pos):
    m = len(pos)
    if draw(st.booleans()) or not m:
        mask = draw(st.lists(st.booleans(), min_size=m, max_size=m))
        return sub(view, np.array(mask, dtype=bool)), [p for p, k in zip(pos, mask) if k]
    idx = draw(st.lists(st.integers(-m, m - 1), max_size=20))
    return sub(view, idx), [pos[j] for j in idx]


def st_cycle(draw, view, pos):
    m = len(pos)
    if not m:
        return ls.cycle(view, 0), []
    if draw(st.booleans()):
        limit = draw(st.integers(0, 3 * m))
        return ls.cycle(view, limit), [pos[i % m] for i in range(limit)]
    start, step = draw(st.integers(0, 3 * m)), draw(st.integers(1, 3))
    if draw(st.booleans()):  # a negative step needs a start on an infinite view
        stop = draw(st.none() | st.integers(0, start))
        key, idx = slice(start, stop, -step), range(start, -1 if stop is None else stop, -step)
    else:
        stop = start + draw(st.integers(0, 2 * m))
        key, idx = slice(start, stop, step), range(start, stop, step)
    return ls.cycle(view)[key], [pos[i % m] for i in idx]


def st_shuffle(draw, view, pos):
    seed, epoch = draw(st.integers(0, 2**64)), draw(st.integers(0, 5))
    v = ls.shuffle(view, seed, epoch)
    order = v.order()
    assert sorted(order) == list(range(len(pos)))
    return v, [pos[j] for j in order]


def st_shard(draw, view, pos):
    count = draw(st.integers(1, 4))
    index, drop = draw(st.integers(0, count - 1)), draw(st.booleans())
    part = pos[index::count]
    return ls.shard(view, index, count, drop), part[: len(pos) // count] if drop else part


def st_concatenate(draw, view, pos):
    keys_ = draw(st.lists(slices(len(pos)), min_size=1, max_size=3))
    return ls.concatenate([sub(view, k) for k in keys_]), [p for k in keys_ for p in pos[k]]


def st_interleave(draw, view, pos):
    keys_ = draw(st.lists(slices(len(pos)), min_size=1, max_size=3))
    return ls.interleave(*[sub(view, k) for k in keys_]), interleave_ref(*[pos[k] for k in keys_])


def st_switch(draw, view, pos):
    cond = draw(st.lists(st.booleans(), min_size=len(pos), max_size=len(pos)))
    if draw(st.booleans()):
        cond = np.array(cond, dtype=bool)
    rev = pos[::-1]
    return ls.switch(cond, view, sub(view, slice(None, None, -1))), [p if c else r for c, p, r in zip(cond, pos, rev)]


def st_case(draw, view, pos):
    m = len(pos)
    sel = draw(st.lists(st.integers(0, 2), min_size=m, max_size=m))
    perm = draw(st.permutations(range(m)))
    choices = [pos, pos[::-1], [pos[j] for j in perm]]
    v = ls.case(sel, view, sub(view, slice(None, None, -1)), ls.gather(view, perm))
    return v, [choices[s][i] for i, s in enumerate(sel)]


def st_cache(draw, view, pos):
    return ls.add_cache(view, draw(st.integers(0, 6))), pos


def st_batch_unbatch(draw, view, pos):
    k = draw(st.integers(1, 5))
    return ls.unbatch(ls.batch(view, k), k, len(pos) % k or None), pos


def st_instrument(draw, view, pos):
    wrap = draw(st.sampled_from([ls.instrument.monitor_throughput, lambda v: ls.instrument.debug(v, lambda i, x: None)]))
    return wrap(view), pos


STAGES = {
    "gather": st_gather, "slice": st_slice, "index_list": st_index_list, "cycle": st_cycle,
    "shuffle": st_shuffle, "shard": st_shard, "concatenate": st_concatenate, "interleave": st_interleave,
    "switch": st_switch, "case": st_case, "add_cache": st_cache, "batch_unbatch": st_batch_unbatch,
    "instrument": st_instrument,
}


class FlakyList:
    """A plain (non-view) list whose reads at the positions in ``bad`` raise, counting every read."""

    def __init__(self, items: list):
        self.items, self.bad, self.reads = items, set(), 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        self.reads += 1
        x = self.items[i]  # raises IndexError for a bad index, as a list does
        if i % len(self.items) in self.bad:
            raise ValueError(f"bad record {x}")
        return x


class Pipeline:
    def __init__(self, src: list, view, pos: list, stages: list[str], layers: list, root=None):
        self.src, self.view, self.pos, self.stages, self.layers, self.root = src, view, pos, stages, layers, root

    def ref(self) -> list:
        return [self.src[p] for p in self.pos]

    def __repr__(self) -> str:
        return f"Pipeline({self.stages}, n={len(self.src)}, len={len(self.pos)})"


@st.composite
def pipelines(draw, max_n: int = 30, max_stages: int = 4, flaky: bool = False, stage_names: list[str] | None = None):
    n = draw(st.integers(0, 4) | st.integers(5, max_n) | st.integers(12, max_n))  # not mostly tiny
    src = [f"s{i}" for i in range(n)]
    root = FlakyList(src) if flaky else None
    view, pos, layers = (src if root is None else root), list(range(n)), []
    stages = draw(st.lists(st.sampled_from(sorted(stage_names or STAGES)), min_size=1, max_size=max_stages))
    for name in stages:
        view, pos = STAGES[name](draw, view, pos)
        if len(pos) > 60:  # keep examples small: cut long intermediate results
            view, pos = view[:60], pos[:60]
        layers.append((view, pos))
    return Pipeline(src, view, pos, stages, layers, root)


_counter = itertools.count()


def fresh(k: int) -> list[str]:
    return [f"w{next(_counter)}" for _ in range(k)]


# -- bulk reads that go past failures (what prefetch workers evaluate chunks with) ------------------
def outcome(view, i):
    try:
        return view[i]
    except Exception as e:
        return e


def check_each(p: Pipeline, data) -> tuple[int, int]:
    """``_get_each`` gives what reading item by item gives: the value, or the same exception (type
    and message). Returns the source reads of both ways."""
    m, root = len(p.pos), p.root
    root.bad = set(data.draw(st.lists(st.integers(0, len(p.src) - 1), max_size=4))) if p.src else set()
    view = p.view if isinstance(p.view, ls.View) else ls.gather(p.view, range(len(p.view)))
    if data.draw(st.booleans()):
        view = ls.smap(str.upper, view)
    idx = data.draw(st.lists(st.integers(0, m - 1), max_size=25)) if m else []
    root.reads = 0
    expected = [outcome(view, i) for i in idx]
    one_by_one, root.reads = root.reads, 0
    got = view._get_each(idx)
    assert len(got) == len(idx)
    for i, g, e in zip(idx, got, expected):
        if isinstance(e, Exception):
            assert type(g) is ls.base.Failed, (i, g, e)
            err = ls.base.raised(g.error, i, view)
            assert type(err) is type(e) and str(err) == str(e)
        else:
            assert g == e
    return one_by_one, root.reads


@SETTINGS
@given(pipelines(max_stages=3, flaky=True), st.data())
def test_bulk_reads_go_past_failing_items(p: Pipeline, data):
    check_each(p, data)


@SETTINGS
@given(pipelines(max_stages=3, flaky=True, stage_names=["gather", "slice", "index_list", "cycle", "shuffle", "shard"]),
       st.data())
def test_bulk_reads_through_index_views_read_each_item_once(p: Pipeline, data):
    one_by_one, bulk = check_each(p, data)
    assert bulk == one_by_one  # no item read again after a failure


# -- flat pipelines --------------------------------------------------------------------------------
@SETTINGS
@given(pipelines(), st.data())
def test_pipeline_reads_match_list(p: Pipeline, data):
    ref, view = p.ref(), p.view
    assert isinstance(view, ls.View)
    assert len(view) == len(ref)
    assert list(view) == ref
    assert list(reversed(view)) == ref[::-1]
    assert bool(view) == bool(ref)
    for _ in range(4):
        key = data.draw(keys(len(ref)), label="key")
        want, got = ref_get(ref, key), view_get(view, key)
        assert same(got, want), (key, got, want)
    # a key on the result of a key (slices of slices fold; gathers of slices...)
    k1 = data.draw(st.one_of(slices(len(ref)), keys(len(ref), allow_bad=False)), label="k1")
    if not isinstance(k1, (int, np.integer)) and not isinstance(r1 := ref_get(ref, k1), Err):
        v1 = view[k1]
        k2 = data.draw(keys(len(r1)), label="k2")
        assert same(view_get(v1, k2), ref_get(r1, k2))
    # bulk reads (the path prefetch workers use), short and vectorised, at every layer
    for layer, pos in p.layers:
        lref = [p.src[j] for j in pos]
        assert list(layer) == lref
        if lref:
            idx = data.draw(st.lists(st.integers(0, len(lref) - 1), max_size=80), label="bulk")
            perm = data.draw(st.permutations(range(len(lref))), label="perm")
            for i in (idx, perm, perm * 3, range(len(lref)), range(len(lref) - 1, -1, -1)):
                assert layer._get_many(i) == [lref[k] for k in i]


@SETTINGS
@given(pipelines(), st.data())
def test_pipeline_writes_go_through(p: Pipeline, data):
    model = list(p.src)
    for _ in range(data.draw(st.integers(1, 3), label="n_writes")):
        key = data.draw(keys(len(p.pos)), label="write key")
        targets = ref_get(p.pos, key)
        if isinstance(key, (int, np.integer)):
            (value,) = fresh(1)
            if isinstance(targets, Err):
                with pytest.raises(targets.exc):
                    p.view[key] = value
            else:
                p.view[key] = value
                model[targets] = value
        elif isinstance(targets, Err):
            with pytest.raises(targets.exc):
                p.view[key] = fresh(1)
        else:
            values = fresh(len(targets))
            kind = data.draw(st.sampled_from([list, tuple, iter, np.array]), label="values as")
            p.view[key] = values if kind is list or not values else kind(values)
            for t, v in zip(targets, values):
                model[t] = v
            # views cannot grow or shrink: a wrong number of values is refused, and nothing is written
            with pytest.raises(ValueError, match="one-to-one"):
                p.view[key] = fresh(len(targets) + 1)
        assert p.src == model
        if "add_cache" not in p.stages:  # a cache over aliased items (cycle, gather...) keeps stale copies
            assert list(p.view) == p.ref()


def excite(x: str) -> str:
    return x + "!"


def join(a: str, b: str) -> str:
    return a + b


@FEW
@given(pipelines(max_stages=3), st.data())
def test_mapped_pipelines_are_read_only(p: Pipeline, data):
    ref = p.ref()
    f = excite
    m = ls.smap(f, p.view)
    sm = ls.starmap(join, ls.collate([p.view, p.view]))
    assert list(m) == [f(x) for x in ref]
    assert list(sm) == [x + x for x in ref]
    zipped = ls.smap(join, p.view, sub(p.view, slice(None, None, -1)))
    assert list(zipped) == [a + b for a, b in zip(ref, ref[::-1])]
    if ref:
        idx = data.draw(st.lists(st.integers(0, len(ref) - 1), min_size=1, max_size=50), label="bulk")
        assert m._get_many(idx) == [f(ref[i]) for i in idx]
        assert sm._get_many(idx) == [ref[i] + ref[i] for i in idx]
        assert zipped._get_many(idx) == [ref[i] + ref[-1 - i] for i in idx]
    for _ in range(3):
        key = data.draw(keys(len(ref)), label="key")
        want = ref_get(ref, key)
        want = want if isinstance(want, Err) else f(want) if isinstance(key, (int, np.integer)) else [f(x) for x in want]
        assert same(view_get(m, key), want)
    before = list(p.src)
    if ref:
        for target in (m, sm, m[::-1], ls.gather(m, [0]), ls.cycle(m, 3)):
            with pytest.raises(TypeError, match=r"smap\(excite\)|starmap\(join\)"):
                target[0] = "x"
        with pytest.raises(TypeError, match=r"smap\(excite\)"):
            m[:1] = ["x"]
        with pytest.raises(TypeError, match=r"smap\(excite\)"):
            m[[0]] = ["x"]
    assert p.src == before


# -- terminal views that change the item type ------------------------------------------------------
PADS = [None, -1, ls.Pad(None), ls.Pad("pad")]


@SETTINGS
@given(pipelines(max_stages=3), st.integers(1, 6), st.booleans(), st.sampled_from(PADS), st.sampled_from([None, tuple]),
       st.data())
def test_batch(p: Pipeline, k, drop_last, pad, collate_fn, data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = ls.batch(p.view, k, drop_last=drop_last, pad=pad, collate_fn=collate_fn)
    if drop_last and pad is not None:
        assert [w.category for w in caught] == [UserWarning]
        pad = None
    else:
        assert not caught
    chunks = [p.pos[i : i + k] for i in range(0, len(p.pos), k)]
    if drop_last and chunks and len(chunks[-1]) < k:
        chunks.pop()
    padv = pad.value if isinstance(pad, ls.Pad) else pad

    def expected() -> list:
        out = []
        for c in chunks:
            items = [p.src[j] for j in c] + ([padv] * (k - len(c)) if pad is not None else [])
            out.append(collate_fn(items) if collate_fn else items)
        return out

    ref = expected()
    assert len(b) == len(ref) and list(b) == ref
    for _ in range(2):
        key = data.draw(keys(len(ref)), label="key")
        assert same(view_get(b, key), ref_get(ref, key))
    if not chunks:
        return
    model = list(p.src)
    i = data.draw(st.integers(-len(chunks), len(chunks) - 1), label="batch index")
    values = fresh(len(chunks[i]))
    b[i] = values
    for t, v in zip(chunks[i], values):
        model[t] = v
    key = data.draw(slices(len(chunks)), label="slice")
    sel = chunks[key]
    vals = [fresh(len(c)) for c in sel]
    b[key] = vals
    for c, vs in zip(sel, vals):
        for t, v in zip(c, vs):
            model[t] = v
    assert p.src == model
    if pad is not None and len(chunks[-1]) < k:  # a padded batch may be written back padded
        vals = fresh(k)
        b[-1] = vals
        for t, v in zip(chunks[-1], vals):
            model[t] = v
        assert p.src == model
    with pytest.raises(ValueError):
        b[0] = fresh(k + 1)
    assert p.src == model
    if "add_cache" not in p.stages:
        assert list(b) == expected()


@SETTINGS
@given(pipelines(max_stages=3), st.data())
def test_collate(p: Pipeline, data):
    rev = p.pos[::-1]
    c = ls.collate([p.view, sub(p.view, slice(None, None, -1))])
    ref = [(p.src[a], p.src[b]) for a, b in zip(p.pos, rev)]
    assert list(c) == ref
    key = data.draw(keys(len(ref)), label="key")
    assert same(view_get(c, key), ref_get(ref, key))
    if not ref:
        return
    idx = data.draw(st.lists(st.integers(0, len(ref) - 1), min_size=1, max_size=50), label="bulk")
    assert c._get_many(idx) == [ref[i] for i in idx]
    model = list(p.src)
    i = data.draw(st.integers(-len(ref), len(ref) - 1), label="i")
    a, b = fresh(2)
    c[i] = (a, b)
    model[p.pos[i]], model[rev[i]] = a, b
    assert p.src == model
    with pytest.raises(ValueError):
        c[0] = ("only one",)
    assert p.src == model
    if "add_cache" not in p.stages:
        assert list(c) == [(p.src[a], p.src[b]) for a, b in zip(p.pos, rev)]


@SETTINGS
@given(pipelines(max_stages=3), st.data())
def test_split(p: Pipeline, data):
    m = len(p.pos)
    if data.draw(st.booleans(), label="pairs"):
        pairs = data.draw(st.lists(st.tuples(st.integers(-2, m + 2), st.integers(-2, m + 2)), max_size=5), label="pairs")
        edges = pairs
        bounds = [(min(max(a, 0), m), min(max(b, 0), m)) for a, b in pairs]
    else:
        cuts = data.draw(st.lists(st.integers(-2, m + 2), min_size=1, max_size=5), label="cuts")
        edges = np.array(cuts) if data.draw(st.booleans(), label="np") else cuts
        clipped = [min(max(c, 0), m) for c in cuts]
        bounds = list(zip([0, *clipped], [*clipped, m]))
    s = ls.split(p.view, edges)
    parts = [p.pos[a:b] for a, b in bounds]
    assert len(s) == len(parts)
    assert [list(x) for x in s] == [[p.src[j] for j in part] for part in parts]
    if not parts:
        return
    model = list(p.src)
    i = data.draw(st.integers(-len(parts), len(parts) - 1), label="i")
    values = fresh(len(parts[i]))
    s[i] = values
    for t, v in zip(parts[i], values):
        model[t] = v
    assert p.src == model
    with pytest.raises(ValueError):
        s[i] = fresh(len(parts[i]) + 1)
    assert p.src == model


@FEW
@given(st.integers(0, 40), st.integers(1, 6), st.data())
def test_split_into_equal_parts(n, parts, data):
    n -= n % parts
    src = list(range(n))
    s = ls.split(src, parts - 1)
    size = n // parts
    assert [list(x) for x in s] == ([src[i * size : (i + 1) * size] for i in range(parts)] if n else [])
    if n % (parts + 1):
        with pytest.raises(ValueError, match="divide"):
            ls.split(src, parts)


@SETTINGS
@given(st.lists(st.lists(st.integers(), min_size=3, max_size=3), max_size=8), st.integers(1, 3), st.data())
def test_unbatch_of_stored_batches(batches, last, data):
    if batches:
        batches[-1] = batches[-1][:last]
    u = ls.unbatch(batches, 3, last)
    ref = [x for b in batches for x in b]
    assert len(u) == len(ref) and list(u) == ref
    key = data.draw(keys(len(ref)), label="key")
    assert same(view_get(u, key), ref_get(ref, key))
    if ref:
        idx = data.draw(st.lists(st.integers(0, len(ref) - 1), max_size=50), label="bulk")
        assert u._get_many(idx) == [ref[i] for i in idx]
        i = data.draw(st.integers(-len(ref), len(ref) - 1), label="i")
        u[i] = "w"
        ref[i] = "w"
        assert [x for b in batches for x in b] == ref


# -- sources that are not lists --------------------------------------------------------------------
@SETTINGS
@given(st.integers(-30, 30), st.integers(-30, 30), st.integers(-5, 5).filter(bool), st.data())
def test_arange_is_range(start, stop, step, data):
    a, r = ls.arange(start, stop, step), range(start, stop, step)
    ref = list(r)
    assert len(a) == len(r) and list(a) == ref
    for _ in range(4):
        key = data.draw(keys(len(ref)), label="key")
        assert same(view_get(a, key), ref_get(ref, key))
    key = data.draw(slices(len(ref)), label="slice")
    if key.step != 0:
        sub_ = a[key]
        assert type(sub_) is type(a) and list(sub_) == ref[key]
    if ref:
        with pytest.raises(TypeError, match="arange"):
            a[0] = 1
    assert list(ls.arange(abs(stop))) == list(range(abs(stop)))


@SETTINGS
@given(st.integers(0, 12), st.data())
def test_repeat_is_list_of_one_value(times, data):
    value = object()
    r = ls.repeat(value, times)
    assert len(r) == times and list(r) == [value] * times
    for _ in range(3):
        key = data.draw(keys(times), label="key")
        assert same(view_get(r, key), ref_get([value] * times, key))
    # every item is the same object: a write replaces the value of every item
    key = data.draw(keys(times), label="write key")
    targets = ref_get(list(range(times)), key)
    values = "new" if isinstance(key, (int, np.integer)) else fresh(0 if isinstance(targets, Err) else len(targets))
    if isinstance(targets, Err):
        with pytest.raises(targets.exc):
            r[key] = values
        assert list(r) == [value] * times
        return
    r[key] = values
    last = values if isinstance(values, str) else values[-1] if values else value
    assert list(r) == [last] * times


@SETTINGS
@given(st.lists(st.integers(), min_size=1, max_size=8), st.data())
def test_infinite_views_take_non_negative_keys(items, data):
    horizon = 200
    for view, ref in ((ls.cycle(items), [items[i % len(items)] for i in range(horizon)]), (ls.repeat("r"), ["r"] * horizon)):
        with pytest.raises(TypeError, match="no len"):
            len(view)
        i = data.draw(st.integers(0, horizon - 1), label="i")
        assert view[i] == ref[i] and view[np.int64(i)] == ref[i]
        with pytest.raises(IndexError):
            view[-data.draw(st.integers(1, 50), label="neg")]
        start = data.draw(st.integers(0, 40), label="start")
        stop = data.draw(st.integers(0, 60), label="stop")
        step = data.draw(st.integers(1, 4), label="step")
        assert list(view[start:stop:step]) == ref[start:stop:step]
        assert list(view[stop:start:-step]) == ref[stop:start:-step]
        assert list(view[start::-step]) == ref[start::-step]
        opened = view[start::step]  # open-ended: infinite again
        with pytest.raises(TypeError):
            len(opened)
        assert [opened[j] for j in range(10)] == ref[start::step][:10]
        assert list(opened[2:7]) == ref[start::step][2:7]
        assert list(opened[3::2][:5]) == ref[start::step][3::2][:5]
        idx = data.draw(st.lists(st.integers(0, horizon - 1), max_size=30), label="idx")
        assert list(view[idx]) == [ref[j] for j in idx]
        assert view._get_many(idx) == [ref[j] for j in idx]


@SETTINGS
@given(st.integers(0, 40), st.integers(0, 6), st.integers(1, 4), st.booleans(), st.data())
def test_uniter_random_access_is_the_list(n, cache_size, n_parallel, sized, data):
    u = ls.uniter(range(n), cache_size=cache_size, n_parallel=n_parallel, size=n if sized else None)
    for i in data.draw(st.lists(st.integers(0, n + 2), max_size=30), label="reads"):
        if i < n:
            assert u[i] == i
        else:
            with pytest.raises(IndexError):
                u[i]
    assert list(u) == list(range(n))
    if sized:
        key = data.draw(keys(n), label="key")
        assert same(view_get(u, key), ref_get(list(range(n)), key))
