"""Lazy views, one module per family: mapping, indexing, filtering, shape, caching."""
