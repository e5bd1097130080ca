"""hermetic: repeatable ML training runs.

A lockfile and a small hermetic.yaml become a byte-reproducible OCI image
referenced by digest; runs inside it leave a complete, diffable record.
"""

__version__ = "0.1.0"
