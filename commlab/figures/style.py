"""What every figure shares: a title that sits below the chart's toolbar, and legends that say
which panel they belong to."""
from __future__ import annotations

# The toolbar (plotly's modebar) floats over the top 30 px of a chart: titles start under it.
TOOLBAR_PX = 32


def title(text: str) -> dict:
    """A layout title, left-aligned under the toolbar."""
    return dict(text=text, x=0, xanchor="left", xref="paper", y=1, yref="container",
                yanchor="top", pad=dict(t=TOOLBAR_PX))


def top_margin(lines: int = 1) -> int:
    """The top margin that leaves room for the toolbar and a title of ``lines`` lines."""
    return TOOLBAR_PX + 24 * lines + 8
