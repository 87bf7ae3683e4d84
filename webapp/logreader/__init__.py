"""The log mirror: what each lab topic holds, whoever wrote it. The lab's ground truth.
May import settings, store and domain; never web.

For the agent::

    reader = LogReader(database_url, bootstrap_servers)       # every lab schema, by default
    thread = threading.Thread(target=reader.run, args=(stop_event,), daemon=True)
    thread.start()                                            # ... stop_event.set(); thread.join()

or ``reader.poll_once()`` from a loop of its own (one batch per call, up to ``poll_timeout``
seconds). ``python -m webapp.logreader`` runs it as a process of its own. After producing, a caller that
wants its next read to include the records calls ``wait_mirrored(conn, lab, [(partition, offset),
...])`` (a bounded wait on ``log_records``; False when the reader is behind).
"""
from .reader import BATCH, LogReader, default_labs, record_row, wait_mirrored

__all__ = ["BATCH", "LogReader", "default_labs", "record_row", "wait_mirrored"]
