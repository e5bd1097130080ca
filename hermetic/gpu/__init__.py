"""GPU compatibility, pure functions only: which CUDA a lock pins (cuda.py); the build-time
checks of the wheels against the base and its Python (wheels.py); the run-time checks of the
host driver and GPU against the image (runtime.py); both say what they found as Findings
(findings.py)."""
