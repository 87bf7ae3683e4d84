"""``python -m webapp.agent``: run a lab agent in the foreground (see loop.py)."""
import sys

from .loop import main

if __name__ == "__main__":
    sys.exit(main())
