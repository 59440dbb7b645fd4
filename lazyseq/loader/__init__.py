"""What a training loop holds: :class:`~lazyseq.loader.dataloader.DataLoader` (a composition of
views, with its plan, saved state, argument checks and words), the collate functions
(:mod:`.batching`), tinygrad Tensors from slots (:mod:`.tensor`), the global generators' seeding
(:mod:`.seeding`) and the C compiler tinygrad's CPU device needs (:mod:`.cc`)."""
