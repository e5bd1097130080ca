"""Figures of runs' metrics over steps, drawn by matplotlib (the ``plots`` extra) on demand.

``render.py``: the figure model and its renderer; ``runs.py``: runs and groups as panels (``runs plot``,
``diff --plot``, the MLflow export's figure).
"""
