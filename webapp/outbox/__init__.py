"""The transactional outbox's relay: ``python -m webapp.outbox`` publishes a lab's outbox rows to
Kafka and marks them sent (relay.py). May import kafka, settings, store and domain.
The lab agent keeps one running per lab that asked for one (agent/relays.py).

The payments service's side (the payment and its outbox row in one transaction) is the web's
``publish_via_outbox`` operation; the SQL of both sides is in store/outbox.py.

This package's ``__init__`` imports nothing, so importing ``webapp.outbox`` loads no Kafka client.
"""
