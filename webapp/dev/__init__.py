"""Development and test bring-up: the embedded services (a private PostgreSQL, the Tansu broker),
the one stack bring-up the launcher, the tests and every bench share (stack.py), and the
`make run` launcher. May import any room; nothing in the product imports it."""
