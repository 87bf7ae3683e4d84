"""The explorer: searches fault schedules against a strategy, shrinks the first that fails, and hands
it back as a scenario file. It drives the lab only through the scenario runner (and so through ops):
never the agent, Kafka or a consumer directly.

- ``schedule``: schedules (episodes of faults), generated from a seed, compiled to a scenario (pure);
- ``search``: ``explore()``: run, judge by the verdict, shrink, reproduce.
"""
