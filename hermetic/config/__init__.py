"""hermetic.yaml and what it decides: the loader and schema (load), the determinism knobs, ``{seed}`` in a
script's arguments, ``--gpus``, which names are secrets, and where things are inside a run's container."""
