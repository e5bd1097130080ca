"""Content-addressed stores: wheels (by sha256) and OCI blobs (by digest)."""
