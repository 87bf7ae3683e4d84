"""``python -m webapp.agent``: run a lab agent in the foreground (see loop.py).

The entry point wires guided mode's clicks (``scenario.step``, scenarios/guided.py) into the
agent's commands: the agent's own modules never import scenarios."""
import sys

from ..domain import verbs
from ..scenarios.guided import agent_handler
from .loop import main

if __name__ == "__main__":
    sys.exit(main({verbs.SCENARIO_STEP: agent_handler}))
