"""Others' formats, read where they lie, as random-access sources (DESIGN section 2, "sources"):
Parquet (:func:`~lazyseq.formats.parquet.parquet`), Arrow IPC files and Hugging Face datasets
(:mod:`.arrow`), Lance (:mod:`.lance`): each a :class:`~lazyseq.formats.blocks.Blocks` view (rows
in blocks, a few decoded per process) whose items are dicts built by
:mod:`~lazyseq.formats.values`; and WebDataset tar shards (:mod:`.webdataset`, a view of its own:
headers indexed by :mod:`.tar`, :mod:`.tarscan` and :mod:`.tarindex`, the index cache :mod:`.tarcache`, compressed
shards :mod:`.untar`). Files are opened through the files layer (:mod:`.sources`).
The readers' packages (pyarrow, datasets, pylance) are imported when a function is called, never
at ``import lazyseq``."""
