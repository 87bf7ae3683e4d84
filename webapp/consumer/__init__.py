"""The consumer process (run as ``python -m webapp.consumer``); see loop.py."""
