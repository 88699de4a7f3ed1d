"""Teaching allreduce on real processes: collectives, the ring trace, gradient averaging, bandwidth, headroom."""
