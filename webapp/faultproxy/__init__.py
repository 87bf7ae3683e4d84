"""The lost-ack fault proxy: a Kafka-aware TCP proxy between Kafka clients and the broker.
May import store and domain (its control rows and migrations); ops imports its constants (control.py).

``python -m webapp.faultproxy --listen 127.0.0.1:P --upstream host:port``, its own process
(never inside gunicorn). It forwards every byte unchanged in both directions and reads only
frame headers. Every fault is one lab's and acts only on requests whose client id names that lab.
The rooms: protocol.py (Kafka's wire framing, the headers it reads), faults.py (what a fault does:
drop or delay Produce responses, block a client's OffsetCommit; per lab), control.py (the control
rows: ``lab_control.fault_proxies`` for the process, ``fault_proxy_labs`` for each lab's faults;
arming, acknowledgements, heartbeat, the timeline), proxy.py (the asyncio proxy, serve and main).
With ``--learner-listen``, a second listener is the learners' gateway: gateway.py (SASL/PLAIN,
authorization of each request against a lane's topic and group), messages.py and wire.py (the
message schemas it reads and writes), principals.py (the lanes' credentials, in PostgreSQL).
"""
from .proxy import main

__all__ = ["main"]
