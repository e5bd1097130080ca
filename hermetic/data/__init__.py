"""Datasets: checksum manifests (sha256sum / BagIt format), their verification (verify.verify_dataset,
verify_configured), making them (verify.build_manifest), and the stat cache that keeps a warm verify fast."""
