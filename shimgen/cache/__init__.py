"""Caches: state.json per project and the cache shared across machines."""
