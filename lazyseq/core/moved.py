"""The modules that moved when the package was laid out by layer, under the names earlier versions
gave them. A pickle written before names ``lazyseq.base.Slice``, a saved loader state or a save
in progress holds fingerprints that name ``lazyseq.batching:default_collate``: both must keep
working, so :func:`alias_earlier_names` makes every earlier name import the module that moved, and
fingerprints name a moved module by its earlier name (:func:`earlier_name`), so that they compare
equal across the move.

>>> import lazyseq, lazyseq.core.base
>>> import lazyseq.base
>>> lazyseq.base is lazyseq.core.base, earlier_name("lazyseq.loader.batching")
(True, 'lazyseq.batching')
>>> from lazyseq.dataloader_plan import Plan
>>> Plan.__module__
'lazyseq.loader.plan'
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["MOVED", "alias_earlier_names", "earlier_module", "earlier_name"]

MOVED = {  # earlier name -> where the module is now
    **{f"lazyseq.{m}": f"lazyseq.core.{m}" for m in
       ("aio", "base", "fingerprints", "html", "jobslot", "keys", "node", "routed", "serialization", "tree")},
    "lazyseq.batching": "lazyseq.loader.batching",
    "lazyseq.dataloader": "lazyseq.loader.dataloader",
    "lazyseq.dataloader_checks": "lazyseq.loader.checks",
    "lazyseq.dataloader_plan": "lazyseq.loader.plan",
    "lazyseq.dataloader_state": "lazyseq.loader.state",
    "lazyseq.dataloader_words": "lazyseq.loader.words",
    "lazyseq.seeding": "lazyseq.loader.seeding",
    "lazyseq.tensor": "lazyseq.loader.tensor",
}
_EARLIER = {now: earlier for earlier, now in MOVED.items()}


def earlier_name(module: str) -> str:
    """The name fingerprints give ``module``: its earlier name if it moved, else its own."""
    return _EARLIER.get(module, module)


def alias_earlier_names() -> None:
    """Make ``sys.modules`` answer each earlier name with the module that moved (imported here:
    they are all small, and ``import lazyseq`` imports most of them anyway), so that unpickling
    and ``import lazyseq.base`` find them. The package's attributes are left alone: the earlier
    names are not public names."""
    for earlier, now in MOVED.items():
        sys.modules.setdefault(earlier, importlib.import_module(now))


def earlier_module(name: str) -> object:
    """The package's ``__getattr__``: ``lazyseq.base`` after ``import lazyseq.base`` is the module
    now at ``lazyseq.core.base``, as it was before (other missing names raise AttributeError)."""
    module = sys.modules.get(MOVED.get(f"lazyseq.{name}", ""))
    if module is None:
        raise AttributeError(f"module 'lazyseq' has no attribute {name!r}")
    return module
