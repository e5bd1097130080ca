"""Figures of runs' metrics over steps, drawn by matplotlib (the ``plots`` extra) on demand.

``render.py``: the figure model (panels of curves, bands and marks) and its
one renderer, to PNG or SVG. ``runs.py``: runs and seed groups turned into
panels and drawn: ``hermetic runs plot`` (a run's own figure too, which its
README says how to draw), ``hermetic diff --plot`` and the MLflow export's
figure. matplotlib is imported when a figure is drawn, never by another
command.
"""
