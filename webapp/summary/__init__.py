"""The running summaries of the verdict and of the accounts' expected balances: the fold of what the
triggers queue (their DDL: store/verdict_changes.py), the reads, the upkeep. May import store and domain only."""
