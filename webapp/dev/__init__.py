"""Development and test bring-up: the embedded services (a private PostgreSQL, the Tansu broker)
and the `make run` launcher. May import any room; nothing in the product imports it."""
