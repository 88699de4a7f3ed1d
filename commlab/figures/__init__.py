"""Plotly figures for the pages and notebooks, one module per subject."""
