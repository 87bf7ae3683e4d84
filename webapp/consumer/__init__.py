"""The consumer process (``python -m webapp.consumer``; see loop.py): poll, apply by strategy, commit.
May import kafka, strategies, notify's protocol, store and domain; never web, nor Flask."""
