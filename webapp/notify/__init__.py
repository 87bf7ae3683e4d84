"""The notification service: the lab's external side effect, a process of its own.
May import store and domain; strategies and consumers import its protocol.

A payment provider's "payment received" message to the customer, over HTTP on loopback:
``POST /notifications`` with ``{lab, account_id, event_id, amount_cents, text}`` and, optionally,
an ``Idempotency-Key`` header. It keeps what it received in its own tables of the lab's schema
(``notifications``: every request; ``idempotency_keys``: the first response per key), never in
the consumer's transaction: once it has answered, no rollback of the caller takes the message back.

It honours ``Idempotency-Key`` the way the payment APIs that popularised it do: the first request
with a key is delivered and its response stored; a later request with the same key is answered
with that stored response (header ``Idempotent-Replayed: true``) and delivers nothing. The key's
primary key makes two concurrent requests with one key deliver once; the same key with another
body is refused (422).

``python -m webapp.notify --listen 127.0.0.1:PORT`` (DATABASE_URL from the environment). The lab
agent keeps one running as a sidecar in embedded mode; docker compose runs it as a service.
"""
