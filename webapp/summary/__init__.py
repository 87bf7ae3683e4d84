"""The running summaries of the verdict and of the accounts' expected balances: the triggers that
queue changes, the fold that folds them, the reads. Imports store and domain only."""
