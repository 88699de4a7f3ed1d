"""Choosing and shipping a configuration: sweeps, the Pareto front, the what-if model, exports."""
