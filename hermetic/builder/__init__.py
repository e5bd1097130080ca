"""The image builder: plan -> install -> layers -> image -> OCI store (-> engine)."""
