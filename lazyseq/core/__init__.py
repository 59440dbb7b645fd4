"""The view machinery, below every view, source and evaluation: the read protocol (:mod:`.node`),
the :class:`~lazyseq.core.base.View` base class (keys, slices, gathers, bulk reads, writes) and its
index helpers (:mod:`.keys`), views over several parts (:mod:`.routed`), nested structures
(:mod:`.tree`), the slot an item's output may go to (:mod:`.jobslot`), fingerprints, pickling by
source (:mod:`.serialization`), the coroutine runner (:mod:`.aio`) and the notebook repr
(:mod:`.html`). Nothing here imports a view family, a format, an evaluation backend or the loader."""
