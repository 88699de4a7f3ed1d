"""Analysis without processes: the compression rule, the ring's traffic, low-rank error, steady-state metrics, bucket layouts, model shapes."""
