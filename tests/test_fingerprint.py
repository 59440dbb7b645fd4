"""lazyseq.fingerprint and resumes that refuse the wrong pipeline: equal for the same pipeline in
any interpreter, different (naming what changed) for every parameter that decides which item lands
where, blind to what may change by design."""

import functools
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import lazyseq
from lazyseq.core.fingerprints import NotResumable, difference


def double(x):
    return 2 * x


def scale(x, k):
    return k * x


def noisy(x, rng):
    return x + rng.random()


def fp(v):
    return lazyseq.fingerprint(v)


DATA = np.arange(60)


@pytest.mark.parametrize("a, b, named", [
    (lambda: lazyseq.shuffle(DATA, 0), lambda: lazyseq.shuffle(DATA, 1), "shuffle(seed=0 -> 1)"),
    (lambda: lazyseq.shuffle(DATA, 0), lambda: lazyseq.shuffle(np.arange(59), 0), "shape [60] -> [59]"),
    (lambda: lazyseq.smap(double, DATA), lambda: lazyseq.smap(abs, DATA), "smap(f=test_fingerprint:double -> builtins:abs)"),
    (lambda: lazyseq.smap(functools.partial(scale, k=2), DATA), lambda: lazyseq.smap(functools.partial(scale, k=3), DATA),
     "smap(f="),
    (lambda: lazyseq.smap(noisy, DATA, seed=1), lambda: lazyseq.smap(noisy, DATA, seed=2), "smap(seed=1 -> 2)"),
    (lambda: lazyseq.batch(DATA, 4), lambda: lazyseq.batch(DATA, 5), "batch(k=4 -> 5)"),
    (lambda: lazyseq.batch(DATA, 7), lambda: lazyseq.batch(DATA, 7, drop_last=True), "batch(drop_last=false -> true)"),
    (lambda: lazyseq.batch(DATA, 4), lambda: lazyseq.batch(DATA, 4, collate_fn=lazyseq.default_collate), "collate_fn"),
    (lambda: lazyseq.shard(DATA, 0, 2), lambda: lazyseq.shard(DATA, 1, 2), "shard(shard_index=0 -> 1)"),
    (lambda: lazyseq.shard(DATA, 0, 2), lambda: lazyseq.shard(DATA, 0, 3), "shard(shard_count=2 -> 3)"),
    (lambda: lazyseq.block_shuffle(DATA, 5, seed=0), lambda: lazyseq.block_shuffle(DATA, 6, seed=0), "block_shuffle(blocks="),
    (lambda: lazyseq.block_shuffle(DATA, 5, seed=0), lambda: lazyseq.block_shuffle(DATA, 5, seed=0, window=2),
     "block_shuffle(window=8 -> 2)"),
    (lambda: lazyseq.mix([DATA, DATA], [1, 1]), lambda: lazyseq.mix([DATA, DATA], [2, 1]), "mix(weights=[1, 1] -> [2, 1])"),
    (lambda: lazyseq.mix([DATA, DATA], seed=0), lambda: lazyseq.mix([DATA, DATA], seed=1), "mix(seed=0 -> 1)"),
    (lambda: lazyseq.mix([DATA, DATA], stop="first"), lambda: lazyseq.mix([DATA, DATA], stop=50), "mix(stop="),
    (lambda: lazyseq.gather(DATA, [1, 2, 3]), lambda: lazyseq.gather(DATA, [1, 2, 4]), "gather(indexes="),
    (lambda: list(range(5)), lambda: list(range(6)), "len 5 -> 6"),
    (lambda: DATA[:10], lambda: DATA[:10].astype(np.float32), "dtype"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_every_parameter_that_places_items_is_in_it_and_named(a, b, named):
    assert fp(a()) == fp(a()) and json.loads(json.dumps(fp(a()))) == fp(a())
    why = difference(fp(a()), fp(b()))
    assert why is not None and named in why, why


def test_what_may_change_by_design_is_not_in_it():
    base = lazyseq.smap(noisy, lazyseq.shuffle(DATA, 3), seed=1)
    assert fp(lazyseq.at_epoch(base, 5)) == fp(base)  # the epoch: the state records it
    assert fp(lazyseq.add_cache(base, 10)) == fp(lazyseq.add_cache(base, 99)) == fp(base)
    with lazyseq.prefetch(base, 2, "thread") as p:
        assert fp(p) == fp(base)


def test_sources_identity(tmp_path):
    lazyseq.save([{"x": np.full(3, i)} for i in range(20)], tmp_path / "train", method="thread")
    store = lazyseq.load(tmp_path / "train")
    e = fp(store)
    assert e["source"] == "store" and e["name"] == "train" and e["len"] == 20 and len(e["manifest"]) == 32
    os.rename(tmp_path / "train", tmp_path / "copy")
    os.makedirs(tmp_path / "elsewhere")
    os.rename(tmp_path / "copy", tmp_path / "elsewhere" / "train")
    assert fp(lazyseq.load(tmp_path / "elsewhere" / "train")) == e  # a copy elsewhere is the same store
    lazyseq.save([{"x": np.full(3, i)} for i in range(21)], tmp_path / "train", method="thread")
    assert difference(e, fp(lazyseq.load(tmp_path / "train"))) == "store('train'): len 20 -> 21"
    lazyseq.save([{"x": np.full(3, -i)} for i in range(20)], tmp_path / "train", method="thread", overwrite=True)
    assert difference(e, fp(lazyseq.load(tmp_path / "train"))) == "store('train'): manifest changed"
    paths = []
    for k in range(3):
        paths.append(str(tmp_path / f"part-{k}.npy"))
        np.save(paths[-1], np.arange(10 * (k + 1)))
    c = fp(lazyseq.chunks(paths, np.load, lengths=[10, 20, 30]))
    assert c["paths"] == ["part-0.npy", "part-1.npy", "part-2.npy"] and c["lengths"] == [10, 20, 30]
    assert "lengths" in difference(c, fp(lazyseq.chunks(paths, np.load, lengths=[10, 20, 31])))
    assert fp(lazyseq.chunks(paths, np.load))["lengths"] is None  # computed lengths are not read for it


def test_equal_in_another_interpreter(tmp_path):
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        import lazyseq
        sys.path.insert(0, sys.argv[1])
        from test_fingerprint import noisy
        p = lazyseq.batch(lazyseq.smap(noisy, lazyseq.shuffle(np.arange(60), 0), seed=1), 4, drop_last=True)
        print(json.dumps(lazyseq.fingerprint(p)))
    """)
    out = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)], capture_output=True, text=True,
                         check=True).stdout
    here = lazyseq.batch(lazyseq.smap(noisy, lazyseq.shuffle(np.arange(60), 0), seed=1), 4, drop_last=True)
    assert json.loads(out) == fp(here)


# -- DataLoader ---------------------------------------------------------------------------------------
def _stopped_state(dataset, **kw):
    loader = lazyseq.DataLoader(dataset, batch_size=4, shuffle=True, to_tensor=False, **kw)
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(3)]
    return loader.state_dict(), seen


def test_a_resume_with_another_pipeline_is_refused_naming_it():
    state, _ = _stopped_state(lazyseq.smap(noisy, DATA, seed=0), seed=1)
    json.dumps(state)  # a state is JSON
    loader = lazyseq.DataLoader(lazyseq.smap(noisy, DATA, seed=5), batch_size=4, shuffle=True, to_tensor=False)
    with pytest.raises(lazyseq.ResumeMismatch, match=r"smap\(seed=0 -> 5\)") as e:
        loader.load_state_dict(state)
    assert e.value.what == "dataset: smap(seed=0 -> 5)"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader.load_state_dict(state, strict=False)
    assert len(w) == 1 and "seed=0 -> 5" in str(w[0].message)
    other = lazyseq.DataLoader(lazyseq.smap(noisy, DATA, seed=0), batch_size=4, shuffle=True, seed=2, to_tensor=False)
    with pytest.raises(lazyseq.ResumeMismatch, match=r"DataLoader\(seed=1 -> 2\)"):
        other.load_state_dict(state)


def test_what_may_change_loads():
    state, seen = _stopped_state(lazyseq.smap(noisy, DATA, seed=0), seed=1)
    whole = [b.tolist() for b in lazyseq.DataLoader(lazyseq.smap(noisy, DATA, seed=0), batch_size=4, shuffle=True,
                                                     seed=1, to_tensor=False)]
    with lazyseq.DataLoader(lazyseq.smap(noisy, DATA, seed=0), batch_size=4, shuffle=True, num_workers=2,
                            method="thread", to_tensor=False) as resumed:
        resumed.load_state_dict(state)
        assert seen + [b.tolist() for b in resumed] == whole
    old = {k: state[k] for k in ("epoch", "position", "seed", "rank", "world_size")}  # saved before fingerprints
    with pytest.warns(RuntimeWarning, match="without a fingerprint"):
        lazyseq.DataLoader(DATA, batch_size=4, to_tensor=False).load_state_dict(old)


def test_what_is_not_a_function_of_an_index_cannot_be_saved():
    loader = lazyseq.DataLoader(lazyseq.uniter(range(20), size=20), batch_size=4, to_tensor=False)
    with pytest.raises(NotResumable, match="uniter.*not a function of an index"):
        loader.state_dict()

    class Order:  # an iterable sampler without state
        def __iter__(self):
            return iter(range(60))

        def __len__(self):
            return 60
    with pytest.raises(NotResumable, match="sampler .*state_dict"):
        lazyseq.DataLoader(DATA, batch_size=4, sampler=Order(), to_tensor=False).state_dict()
    state = lazyseq.DataLoader(DATA, batch_size=4, sampler=list(range(60)), to_tensor=False).state_dict()
    changed = lazyseq.DataLoader(DATA, batch_size=4, sampler=list(range(59, -1, -1)), to_tensor=False)
    with pytest.raises(lazyseq.ResumeMismatch, match="sampler.*contents changed"):
        changed.load_state_dict(state)


def test_a_save_whose_item_function_changed_refuses_to_resume(tmp_path):
    code = "def item(i):\n    if i == 95:\n        raise ValueError('stop')\n    return {sign}1.0 * i\n"
    ns: dict = {}
    exec(code.format(sign=""), ns)
    path = tmp_path / "s"
    with pytest.raises(lazyseq.EvaluationError):
        lazyseq.save(lazyseq.smap(ns["item"], range(100)), path, method="thread", nworkers=1, shard_bytes=80)
    edited: dict = {}
    exec(code.format(sign="-").replace("i == 95", "i == -1"), edited)  # the same name, other code
    with pytest.raises(FileExistsError, match=r"its pipeline differs: smap\(f=item\): its code changed"):
        lazyseq.save(lazyseq.smap(edited["item"], range(100)), path, method="thread", shard_bytes=80)


def test_a_schedule_changed_after_the_saved_position_resumes():
    a, b = np.arange(0, 1000), np.arange(1000, 2000)
    sched = lazyseq.schedule([(0, [0.9, 0.1]), (400, [0.5, 0.5])])
    state, _ = _stopped_state(lazyseq.mix([a, b], sched, stop=1000), seed=0)  # 12 items read (shuffle=True)
    later = sched.then(200, [(0, [0.2, 0.8])])
    loader = lazyseq.DataLoader(lazyseq.mix([a, b], later, stop=1000), batch_size=4, shuffle=True, to_tensor=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (shuffle=True over a scheduled mix warns)
        loader.load_state_dict(state)  # equal before position 12
        earlier = sched.then(5, [(0, [0.2, 0.8])])
        changed = lazyseq.DataLoader(lazyseq.mix([a, b], earlier, stop=1000), batch_size=4, shuffle=True, to_tensor=False)
    with pytest.raises(lazyseq.ResumeMismatch, match="schedule"):
        changed.load_state_dict(state)
