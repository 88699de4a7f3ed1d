"""A run's random streams, seeded from its one ``seed``: the shared initial weights (``seed``
itself), each rank's data and randomness after them, and the held-out set's."""


def stream_seed(seed: int, stream: int) -> int:
    """The seed of one of a run's random streams: each rank's (``stream`` its rank: its data, its
    randomness after the shared initial weights, a compressor's stochastic rounding) and the
    held-out set's (``workloads.EVAL_STREAM``)."""
    return seed * 1000 + stream
