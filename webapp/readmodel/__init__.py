"""What panels and ``GET /api/v1/state`` show. ``why``: one sentence per anomaly."""
