"""The log mirror: what each lab topic holds, whoever wrote it. The lab's ground truth.

For the agent::

    reader = LogReader(database_url, bootstrap_servers)       # every lab schema, by default
    thread = threading.Thread(target=reader.run, args=(stop_event,), daemon=True)
    thread.start()                                            # ... stop_event.set(); thread.join()

or ``reader.poll_once()`` from a loop of its own (one batch per call, up to ``poll_timeout``
seconds). ``python -m webapp.logreader`` runs it as a process of its own.
"""
from .reader import BATCH, LogReader, default_labs, record_row

__all__ = ["BATCH", "LogReader", "default_labs", "record_row"]
