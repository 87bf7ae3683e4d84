"""What panels and ``GET /api/v1/state`` show: one module per panel, the verdict, ``why`` per anomaly.
May import summary, store, strategies and domain; never ops (callers pass what an operation answers)."""
