"""Slurm: `hermetic submit` (one run, or a seed group as a job array), the tasks on the nodes.

- ``ctl``: the edge: scontrol, sinfo, squeue and sbatch, with one-line errors
  (no controller, unknown partition); a finished job's state without slurmdbd.
- ``script``: the sbatch scripts (pure): the task script for Docker on the
  nodes, the dependent group-summary job, and the pyxis/enroot export.
- ``submission``: what is decided at submit time and read on the nodes
  (``slurm/submit.json``): the prepared RunRequest, the members, the image.
- ``submit``: the checks made before anything is submitted, the snapshot, the
  run (or group) directory, the scripts, sbatch.
- ``task``: one task on its node: the image by digest (pulled and verified
  when the node's store lacks it), then hermetic.run.runner.execute, the
  same steps `hermetic run` takes, into the run directory prepared for it.
- ``summary``: the group summary job (after the array, ``afterany``).
- ``state``: ``slurm.json`` beside a prepared run, and the live states
  `hermetic runs` and ``--wait`` read.
"""
