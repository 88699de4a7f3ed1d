"""What every figure shares: a title that sits below the chart's toolbar, legends that say which
panel they belong to, and one colour per series."""
from __future__ import annotations

from plotly.colors import qualitative

# The toolbar (plotly's modebar) floats over the top 30 px of a chart: titles start under it.
TOOLBAR_PX = 32
# Twelve colours told apart at a glance (a sweep's worth of runs, the Compare page's cap), then
# twelve more: plotly's default palette repeats after ten.
SERIES = qualitative.Dark24


def title(text: str) -> dict:
    """A layout title, left-aligned under the toolbar."""
    return dict(text=text, x=0, xanchor="left", xref="paper", y=1, yref="container",
                yanchor="top", pad=dict(t=TOOLBAR_PX))


def top_margin(lines: int = 1) -> int:
    """The top margin that leaves room for the toolbar and a title of ``lines`` lines."""
    return TOOLBAR_PX + 24 * lines + 8


def colour(i: int) -> str:
    """The ``i``-th series' colour."""
    return SERIES[i % len(SERIES)]


# A legend beside the plot, top-aligned, outside its axes: it takes width, never the axes' titles.
LEGEND_BESIDE = dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top")
