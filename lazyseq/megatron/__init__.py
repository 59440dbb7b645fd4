"""Language-model corpora: Megatron's indexed ``.bin``/``.idx`` files, read and written, and the
fixed-length GPT samples and blends of tinygrad's MLPerf loader, as random-access views.

- :func:`indexed`: the sequences (documents) of ``prefix.bin``/``prefix.idx``, zero-copy;
- :func:`write`: any sequence of 1-D integer arrays written in that format, streaming, atomically;
- :func:`gpt`: fixed-length samples spanning documents, those of tinygrad's ``GPTDataset``;
- :func:`blend`: the samples of several corpora mixed by weight, those of ``BlendedGPTDataset``;
- :func:`split`: train, valid and test views cut by Megatron's split string (``"969,30,1"``).

``gpt(..., output='megatron')`` gives megatron-core's ``GPTDataset`` items (tokens, labels,
masks, position ids) in numpy.

``from lazyseq import megatron`` (or ``import lazyseq.megatron``) reaches it; docs/megatron.md
is the guide.
"""

from .blending import Blend, blend
from .idx import Indexed, indexed
from .samples import GPT, gpt
from .splits import split
from .writer import write

__all__ = ["indexed", "write", "gpt", "blend", "split", "Indexed", "GPT", "Blend"]
