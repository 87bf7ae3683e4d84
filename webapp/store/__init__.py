"""Every table (SQLAlchemy Core, no Flask), every statement on them by group of tables, the one way to
enter a lab schema (schema.py) and the Alembic migrations (migrations/). May import domain only."""
