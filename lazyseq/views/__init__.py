"""Lazy views, one module per family: mapping, indexing, shape, caching."""
