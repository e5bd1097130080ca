"""The scalars of TensorBoard event files, read with TensorBoard's own reader (EventFileLoader).

Standard library and ``tensorboard`` only (Python 3.8+): it runs as ``python -I tb_scalars.py REQUEST`` in a
locked-down container of the run's image (outputs read-only; one JSON document printed), or, where the image has
no tensorboard, in the host's collection child as the container's user (hermetic.run.collect). A value is a
scalar when its tag's summary metadata says so, as TensorBoard's scalars dashboard decides; wall times are never
read. Within caps: MAX_TAGS scalar tags of at most MAX_TAG characters, and the points the caller allows.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys

NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
DATA_CLASS_SCALAR = 1  # tensorboard.compat.proto.summary_pb2.DATA_CLASS_SCALAR
MAX_TAGS = 1000  # scalar tags kept of one file (hermetic.record.metrics.MAX_METRICS)
MAX_TAG = 200  # characters of one tag (hermetic.record.metrics.MAX_NAME)


def available() -> str | None:
    """None when tensorboard's reader imports here, else why not (one line).

    Everything reading needs is imported now, the TensorFlow stub that TensorBoard loads lazily included:
    hermetic calls this before a process drops to the container's user, who may not be allowed to read
    the directories Python and tensorboard are installed in (a forked child inherits what is imported)."""
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.util import tensor_util  # noqa: F401

        event_file_loader.tf.__version__  # the lazily loaded TensorFlow (or its stub)
        event_file_loader.tf.compat.as_bytes  # noqa: B018
        event_file_loader.tf.errors.OutOfRangeError  # noqa: B018
    except Exception as e:  # ImportError, or a broken install
        return f"tensorboard's event reader does not import: {type(e).__name__}: {e}".splitlines()[0]
    return None


def _number(v: float):
    return v if math.isfinite(v) else NONFINITE[repr(v)]  # repr: "nan", "inf" or "-inf"


def read_scalars(path: str, max_points: int) -> dict:
    """``{"tags": {tag: [[step, value], ...]}, "points": n, "truncated": [tags], "left_out": {"points": n,
    "other_names": n}, "error": None | str}``: values as JSON holds them (``"NaN"``, ``"Infinity"``); at most
    ``max_points`` points (the last value of a ``truncated`` tag always kept) of MAX_TAGS tags, the values left
    out counted. A truncated last record (the writer was killed) ends the file, as in TensorBoard."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    tags: dict = {}
    scalar_tags: dict = {}  # tag -> a scalar (at most MAX_TAGS of each kind kept)
    kinds = {True: 0, False: 0}
    truncated: set = set()
    last: dict = {}
    left_out = {"points": 0, "other_names": 0}
    kept = total = 0
    error = None
    try:
        for event in EventFileLoader(path).Load():
            if not event.HasField("summary"):
                continue
            step = int(event.step)
            for value in event.summary.value:
                tag = value.tag
                scalar = scalar_tags.get(tag)
                if scalar is None:  # the first value of a tag carries its metadata
                    meta = value.metadata
                    scalar = meta.plugin_data.plugin_name == "scalars" or meta.data_class == DATA_CLASS_SCALAR
                    if len(tag) > MAX_TAG or kinds[scalar] >= MAX_TAGS:
                        left_out["other_names"] += scalar  # each value of it that says it is a scalar
                        continue
                    scalar_tags[tag] = scalar
                    kinds[scalar] += 1
                if not scalar or not value.HasField("tensor"):
                    continue
                array = tensor_util.make_ndarray(value.tensor)
                if array.size != 1 or array.dtype.kind not in "fiub":
                    continue
                point = [step, _number(float(array.reshape(()).item()))]
                total += 1
                if kept < max_points:
                    tags.setdefault(tag, []).append(point)
                    kept += 1
                else:
                    truncated.add(tag)
                    left_out["points"] += tag in last
                    last[tag] = point
    except Exception as e:  # a corrupt record past the framing: what was read so far stands
        error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    for tag, point in last.items():  # the final value of a cut series is still the last one written
        series = tags.setdefault(tag, [])
        if not series or series[-1] != point:
            series.append(point)
        else:
            left_out["points"] += 1
    return {"tags": tags, "points": total, "truncated": sorted(truncated), "left_out": left_out, "error": error}


def _fs_name(recorded: str) -> str:
    """A record name (``%XX`` for bytes that are not plain UTF-8: hermetic.hostfs.safetree.record_name) as the file
    system's name."""
    if "%" not in recorded:
        return recorded
    from urllib.parse import unquote_to_bytes

    return os.fsdecode(unquote_to_bytes(recorded))


def main(argv: list) -> int:
    """``REQUEST``: ``{"root": dir, "files": [relative paths], "max_bytes": n, "max_points": n}``."""
    request = json.loads(argv[1])
    why = available()
    if why is not None:
        print(json.dumps({"unavailable": why}))
        return 0
    import tensorboard

    budget = int(request["max_points"])
    files = {}
    for rel in request["files"]:
        path = os.path.join(request["root"], _fs_name(rel))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            files[rel] = {"tags": {}, "points": 0, "truncated": [], "error": f"not opened: {e.strerror}"}
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > int(request["max_bytes"]):
                doc = {"tags": {}, "points": 0, "truncated": [], "error": "not a regular file of the allowed size"}
            else:
                doc = read_scalars(f"/proc/self/fd/{fd}", max(budget, 0))
        finally:
            os.close(fd)
        budget -= sum(len(v) for v in doc["tags"].values())
        files[rel] = doc
    print(json.dumps({"tensorboard": getattr(tensorboard, "__version__", "unknown"), "files": files},
                     separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
