"""Flat JSON envelopes with a row list and an old-values list: Canal, Maxwell, OGG."""
