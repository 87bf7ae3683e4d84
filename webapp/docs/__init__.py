"""The documentation site's generated pages (``make docs``: MkDocs, mkdocs.yml at the top).
The highest room: may import every room (the CLI, the web's OpenAPI, scenarios, ops, settings);
nothing imports it.

Nothing here is copied by hand: ``generate`` renders the configuration table from the settings
model, the API and CLI reference from the operation registry, one page per exercise from
``scenarios/`` and the claims table from ``webapp/scenarios/claims.yaml``; ``hooks`` hands them to
MkDocs while it builds (a ``<!-- generated: NAME -->`` line in a page is replaced, and the
exercise pages are added as files of their own).
"""
