"""Locks: resolve requirements for the image's platform, and read every lock format (requirements.txt with
--hash, uv.lock, pylock.toml) into the same ``Lock``."""
