"""GPU compatibility: which CUDA a lock pins (cuda.py) and the checks between
lock, base image, host driver and GPU (checks.py). Pure functions only."""
