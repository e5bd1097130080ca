"""Code that runs inside the image, or on the image's own interpreter: never on hermetic's side.

runtime/ (shipped into every image as hermetic_runtime), probe/ and tb_scalars.py (mounted read-only
into a container of the run's image), pyc_server.py (the bytecode compiler the base's interpreter runs),
gate.py. Standard library only (the training environment's own packages, torch, numpy..., imported lazily
where present), and nothing here imports the host side (hermetic.* outside hermetic.inimage):
tests/test_inimage.py checks both.
"""
