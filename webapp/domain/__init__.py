"""The lab's pure vocabulary: the Lab namespace (names both ways), events, states, limits, chaos plans, waits.
Imports nothing of the project, nor Flask, SQLAlchemy, psycopg or Kafka: the standard library only."""
