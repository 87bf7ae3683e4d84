"""``python -m webapp.faultproxy --listen HOST:PORT --upstream HOST:PORT``: the fault proxy process."""
import sys

from . import main

sys.exit(main())
