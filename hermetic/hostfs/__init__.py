"""The host's filesystem edge: atomic writes and owned temp files, locks, filesystems that refuse,
untrusted trees walked without following a link, privilege drop, tar extraction."""
