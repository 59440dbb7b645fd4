"""Others' formats, read where they lie, as random-access sources (DESIGN section 2, "sources"):
Parquet (:func:`~lazyseq.formats.parquet.parquet`), Arrow IPC files and Hugging Face datasets
(:mod:`.arrow`), Lance (:mod:`.lance`), WebDataset tar shards (:mod:`.webdataset`, indexed by :mod:`.tar`,
its index cache :mod:`.tarcache`). Each but the last is a :class:`~lazyseq.formats.blocks.Blocks` view
(rows in blocks, a few decoded per process) whose items are dicts built by
:mod:`~lazyseq.formats.values`; files are opened through the files layer (:mod:`.sources`).
The readers' packages (pyarrow, datasets, pylance) are imported when a function is called, never
at ``import lazyseq``."""
