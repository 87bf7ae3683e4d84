"""The lab's pure vocabulary: the Lab namespace (names both ways), events, states, limits, chaos plans, waits,
the agent's commands. Imports nothing of the project, nor Flask, SQLAlchemy, psycopg or Kafka: the standard
library, and pydantic for the commands' models (commands.py, which no consumer process imports)."""
