"""Reading what a figure drew, for tests that check a plot's data rather than its pixels."""

from __future__ import annotations

import numpy as np


def band(ax, i: int) -> dict[float, tuple[float, float]]:  # ax: a matplotlib Axes
    """The i-th band (fill_between) the axes hold: x -> (its lowest, its highest) y at that x."""
    vertices = ax.collections[i].get_paths()[0].vertices
    return {
        float(x): (float(vertices[vertices[:, 0] == x, 1].min()), float(vertices[vertices[:, 0] == x, 1].max()))
        for x in np.unique(vertices[:, 0])
    }
