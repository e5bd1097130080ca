"""``hermetic run``: verified inputs -> one container -> one immutable run directory."""
