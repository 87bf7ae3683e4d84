"""`python -m webapp.settings`: print the table of every setting (Markdown), for the docs."""
from . import reference_markdown

if __name__ == "__main__":
    print(reference_markdown(), end="")
