"""The running summaries of the verdict and of the accounts' expected balances: what the
triggers queue (triggers.py; their DDL: store/verdict_changes.py), the per-key facts (facts.py), the
fold and its upkeep (fold.py), the exact reads (reads.py). May import store and domain only.

``verdict.VERDICT_SQL`` judges the whole log and every effect on each call: seconds at a million
records. The summaries keep its answer as it changes, so a panel pays for what changed, not for
what the lab holds; ``VERDICT_SQL`` stays the exact definition, and the answer on demand
(``verdict(..., exact=True)``, ``GET /api/v1/state?exact=1``).

How it stays exact:

- **What changed is written where it changes.** Statement triggers on ``log_records``,
  ``deliveries``, ``payments`` and ``ledger`` copy the keys of the rows an INSERT, UPDATE or DELETE
  touched into ``verdict_changes``, in the writer's own transaction: a change is in the queue
  exactly when its row is committed, whoever wrote it (the log reader, a consumer, a person in
  psql). Each statement appends rows of its own: no counter row is shared, so concurrent consumers
  never wait on each other for it (the check-then-act race stays the race it is). A TRUNCATE
  leaves a ``rebuild`` mark.
- **Facts are recomputed per key, never patched.** The verdict groups facts by transaction
  (``VERDICT_SQL``'s ``per_transaction``). ``verdict_keys`` holds that row per key; a changed key's
  row is computed again from the tables (index lookups), and the totals move by the difference
  of the old and new rows' contributions: the same ``FILTER`` expressions ``VERDICT_SQL`` uses.
  Keys: a transaction id; ``record:<partition>:<offset>`` for an invalid record; ``ledger:<event
  id>`` for a ledger row whose event the log does not hold (yet). A key's row also says since when
  it is wrong (its second effect, its first absorbed delivery): the lanes panel's first divergent
  event is the first row of a partial index (``first_divergence``).
- **Committed offsets move both ways.** The totals keep the committed offsets they reflect;
  where a group's committed offset moved (a commit, a reset back), the records in between are the
  changed keys.
- **Sums move by the queued rows themselves**: the deliveries' outcomes, the accounts' first
  credits (expected) and ledger rows (actual), the chart's cents per second, and which events the
  log holds at several offsets (those events counted again).
- **A read adds what is not folded yet.** One statement (one snapshot) reads the totals and
  recomputes the keys still in the queue: the answer is the verdict of that snapshot, not of the
  last fold. The agent's folder (``agent.periodic.SummaryFolder``: ``fold_lab`` for the labs with
  something queued, ``labs_to_fold``; again after 0.1 s while there is, else after 0.5 s) only
  keeps the queue short, and with it what a read recomputes under a load; it vacuums the queues
  it emptied (``vacuum_queues``) once a second, since a read scans a queue's dead rows too, and
  every ten seconds, on a thread of its own, vacuums them thoroughly and analyzes the tables that
  outgrew their statistics (``analyze_grown_tables``).

A schema without totals (new, or marked for a rebuild) is judged by ``VERDICT_SQL`` until the
folder has built them. ``tests/test_verdict_summary.py`` checks the summaries against
``VERDICT_SQL`` after random changes of every kind.
"""
