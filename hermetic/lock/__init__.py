"""Locks: resolve requirements for the image's platform, and read locks back.

Every supported lock format (requirements.txt with --hash, uv.lock,
pylock.toml) is read into the same ``Lock``: a sorted list of ``LockedWheel``
for one target platform.
"""
