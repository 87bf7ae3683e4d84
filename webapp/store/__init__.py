"""The control plane's statements, one module per group of tables (SQLAlchemy Core on the declared
Tables), and the one way to enter a lab schema (schema.py)."""
