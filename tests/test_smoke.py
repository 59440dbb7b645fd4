import pickle

import numpy as np

import lazyseq as ls


def test_five_view_pipeline_matches_hand_written():
    data = list(range(100))
    idx = np.random.RandomState(0).permutation(100)
    s = ls.smap(sum, ls.batch(ls.gather(ls.smap(lambda x: x * 2, data), idx), 8))[1:10:2]
    expected = [sum(2 * data[j] for j in idx[b * 8 : b * 8 + 8]) for b in range(1, 10, 2)]
    assert list(s) == expected
    assert s[-1] == expected[-1]
    assert list(pickle.loads(pickle.dumps(ls.batch(ls.gather(data, idx), 8)))[0]) == [data[j] for j in idx[:8]]
