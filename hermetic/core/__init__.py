"""The foundation every stage stands on: exit codes and errors, canonical JSON, the cache's paths,
image references, text made safe to print, seed statistics, packaged files, worker processes."""
