"""Kafka clients for the lab: config.py (client configs), admin.py (topics, committed offsets and
group offset resets), producer.py (publish modes, raw records).
May import store and domain; imported by the agent, the consumers, the relay, never by web.

Only the lab agent and the consumer processes create these clients; web processes ask the
agent through PostgreSQL (see commands.py).
"""
