"""What lazyseq wrote before the package was laid out by layer, and the check that it still reads.

``python make_legacy.py write DIR`` was run once with the code of commit ffabdcb (modules at the
package root: lazyseq.base, lazyseq.batching, lazyseq.dataloader_plan ...) and wrote, beside this
file: ``views.pkl`` (views pickled with cloudpickle: they name the modules of that time),
``views.json`` (each view's items and fingerprints), ``loader_state.json`` (a DataLoader's
``state_dict()`` after 2 batches, and the batches that followed) and ``store/`` (a saved store).
``python make_legacy.py check DIR`` reads them all with today's code and prints, as JSON, what was
checked and every difference (tests/test_legacy.py runs it). Run as a script, so that functions
defined here are named ``make_legacy:...`` in fingerprints both times. Do not edit the pipelines:
their fingerprints were written by the old code."""

import importlib
import json
import pickle
import sys

import numpy as np

import lazyseq

SerializableFunc = importlib.import_module("lazyseq.serialization").SerializableFunc  # its earlier module, on purpose


def neg(x):
    return -x


def noisy(x, rng):
    return x + rng.integers(0, 100)


def pipelines():
    data = [(np.full(3, i, np.float32), i % 3) for i in range(24)]
    arr = np.arange(40.0)
    toks = [np.arange(n, dtype=np.int32) for n in (3, 5, 2, 7, 4, 6, 1, 8)]
    return {
        "slice_of_map": lazyseq.smap(np.sqrt, lazyseq.shuffle(arr, seed=3))[2:30:3],
        "gather": lazyseq.gather(arr, [5, 1, 7, 7]),
        "fancy": lazyseq.take(lazyseq.arange(100), np.array([3, 9, 27])),
        "concat": lazyseq.concatenate([range(5), arr[:4]]),
        "mix": lazyseq.mix([range(10), range(100, 110)], weights=[1, 3], seed=2),
        "schedule": lazyseq.mix([range(30), range(100, 130)],
                                weights=lazyseq.schedule([(0, [1, 1]), (10, [1, 3])]), seed=5),
        "batch_pad": lazyseq.batch(toks, 3, collate_fn=lazyseq.pad_collate),
        "varlen": lazyseq.batch(toks, 4, collate_fn=lazyseq.varlen_collate),
        "default_collate": lazyseq.batch(data, 5, collate_fn=lazyseq.default_collate),
        "seeded": lazyseq.smap(SerializableFunc(neg), lazyseq.shard(arr, 1, 4)),
        "item_rng": lazyseq.smap(noisy, arr, seed=11),
        "pack": lazyseq.pack(toks, 8),
        "interleave": lazyseq.interleave(range(4), range(10, 14)),
        "cycle_slice": lazyseq.cycle(range(3))[:7],
        "at_epoch": lazyseq.at_epoch(lazyseq.shuffle(range(12), seed=1), 4),
        "on_error": lazyseq.on_error(lazyseq.smap(np.reciprocal, arr[1:9]), -1.0),
        "cache": lazyseq.add_cache(lazyseq.smap(np.square, arr), 4),
    }


def loader():
    data = [(np.full(3, i, np.float32), i % 3) for i in range(24)]
    return lazyseq.DataLoader(data, batch_size=4, shuffle=True, seed=7, seed_each_item=True, to_tensor=False)


def store_items():
    return [{"x": np.arange(i, dtype=np.int16), "y": np.full((2, 2), i, np.float32), "s": f"item{i}", "n": i}
            for i in range(9)]


def all_views():
    views = pipelines()
    views["loader_sequence"] = loader().make_sequence(2)
    return views


def write(out):
    import cloudpickle

    built = all_views()
    with open(f"{out}/views.pkl", "wb") as f:
        f.write(cloudpickle.dumps(built))
    fps = {name: {"plain": lazyseq.fingerprint(v), "code": lazyseq.fingerprint(v, code=True)} for name, v in built.items()}
    with open(f"{out}/views.json", "w") as f:
        json.dump({"fingerprints": fps, "items": {name: [repr(x) for x in v] for name, v in built.items()}}, f,
                  indent=0, sort_keys=True)
    ld = loader()
    it = iter(ld)
    for _ in range(2):
        next(it)
    state = ld.state_dict()
    with open(f"{out}/loader_state.json", "w") as f:
        json.dump({"state": state, "rest": [repr(b) for b in it]}, f, indent=0, default=int)
    lazyseq.save(store_items(), f"{out}/store", shard_bytes=200, progress=False)


def check(where):
    saved = json.load(open(f"{where}/views.json"))
    with open(f"{where}/views.pkl", "rb") as f:
        loaded = pickle.load(f)  # plain pickle: it imports the modules the pickle names
    fresh = all_views()
    diffs, checked = [], []
    for name, expected in saved["items"].items():
        # a loader's sequence has the loader's own seeding (a fresh owner per loader): compared unpickled
        for how, v in (("unpickled", loaded[name]), ("rebuilt", fresh[name]))[:1 if name == "loader_sequence" else 2]:
            if [repr(x) for x in v] != expected:
                diffs.append(f"{name} {how}: items differ")
            for kind, code in (("plain", False), ("code", True)):
                got = lazyseq.fingerprint(v, code=code)
                want = saved["fingerprints"][name][kind]
                if got != want:
                    diffs.append(f"{name} {how} {kind} fingerprint: {lazyseq.core.fingerprints.difference(want, got)}")
            checked.append(f"{name} {how}")
    state = json.load(open(f"{where}/loader_state.json"))
    ld = loader()
    ld.load_state_dict(state["state"], strict=True)
    rest = [repr(b) for b in ld]
    if rest != state["rest"]:
        diffs.append("loader: the batches after the resume differ")
    checked.append(f"loader resumed at {state['state']['position']}, {len(rest)} batches")
    store = lazyseq.load(f"{where}/store", verify=True)
    got = [(x["x"].tolist(), x["y"].tolist(), x["s"], int(x["n"])) for x in store]
    if got != [(x["x"].tolist(), x["y"].tolist(), x["s"], x["n"]) for x in store_items()]:
        diffs.append("store: items differ")
    checked.append(f"store of {len(store)} items")
    print(json.dumps({"checked": checked, "differences": diffs}))


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
