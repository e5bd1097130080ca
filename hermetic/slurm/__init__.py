"""Slurm: `hermetic submit` (one run, or a seed group as a job array) and the tasks on the nodes: ``ctl`` (the
Slurm commands), ``script`` (the sbatch scripts), ``submit``, ``submission`` (what a task reads), ``shared``
(where a task gets the image), ``task`` and ``pyxis`` (a task on its node), ``summary``, ``state``.
"""
