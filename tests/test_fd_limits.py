"""What a plain account runs out of where root does not: open files (`ulimit -n`) and processes (`ulimit -u`).

Each check runs hermetic in a child process that sets the limit before it starts (preexec). A layer unpacks
with a handful of descriptors however wide or deep it is (the Debian base layer once needed one per
directory, past the usual 1024); hashing takes the workers the limits allow, down to none besides itself;
`hermetic fetch`, which cannot start a download without a thread, says which limit in one line.

RLIMIT_NPROC binds no root process (the kernel exempts uid 0, and CAP_SYS_RESOURCE or CAP_SYS_ADMIN): run
by root, the child is counted as nobody's (its real uid) and loses those two capabilities from its bounding
set, so that the limit binds it; its effective uid stays 0, so it still reads what the test made and runs
this interpreter wherever it lives. Each such child first checks that a fork is refused, so that a test
cannot pass because the limit did not hold.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import resource
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import assert_clean_error
from hermetic.core.errors import EXIT_OSERR
from wheelfactory import make_index, make_wheel, requirements_lock, sha256_of

NOFILE = 64  # the bar: well under a plain account's usual 1024
NOBODY = 65534  # the overflow uid: counts the child's processes apart from root's (RLIMIT_NPROC)
_PR_CAPBSET_DROP = 24  # <linux/prctl.h>
_CAP_SYS_ADMIN, _CAP_SYS_RESOURCE = 21, 24  # <linux/capability.h>: either lifts RLIMIT_NPROC


def limited(*, nofile: int | None = None, nproc: int | None = None):
    """A preexec_fn that gives the child these limits (module doc)."""
    def preexec() -> None:
        if nproc is not None and os.geteuid() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            for cap in (_CAP_SYS_ADMIN, _CAP_SYS_RESOURCE):
                if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
            os.setresuid(NOBODY, 0, 0)
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    return preexec


# Run first in a child under RLIMIT_NPROC: the limit must hold, else the test proves nothing.
FORK_REFUSED = """
import os
try:
    pid = os.fork()
except BlockingIOError:
    pass
else:
    if pid == 0:
        os._exit(0)
    raise SystemExit("RLIMIT_NPROC does not bind this process: the test cannot simulate the limit")
"""


def run_child(code: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None,
              **limits) -> subprocess.CompletedProcess:
    prologue = FORK_REFUSED if limits.get("nproc") is not None else ""
    return subprocess.run([sys.executable, "-c", prologue + code, *args], preexec_fn=limited(**limits),
                          capture_output=True, text=True, timeout=timeout, env=env)


CLI = """
import sys
from hermetic.cli import main
main(sys.argv[1:])
"""  # `hermetic ARGS`


# ---------------------------------------------------------------- a layer, unpacked


def _tar(path: Path, entries: list[tuple[str, bytes, dict]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, extra in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = extra.get("mode", 0o755 if kind == tarfile.DIRTYPE else 0o644)
            info.linkname = extra.get("link", "")
            data = extra.get("data", b"x" if kind == tarfile.REGTYPE else None)
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)


UNPACK = """
import sys
from pathlib import Path
from hermetic.engines.unpack import unpack_tar
with open(sys.argv[1], "rb") as f:
    unpack_tar(f, Path(sys.argv[2]), what="test layer")
"""


def test_a_wide_and_deep_layer_unpacks_within_64_descriptors(tmp_path):
    deep = "/".join(["deep"] + ["d"] * 150)
    gone = "/".join(["gone"] + ["g"] * 100)
    hidden = "/".join(["wh", "hide"] + ["h"] * 100)
    entries = [(f"wide/w{i:03}/f", tarfile.REGTYPE, {"data": str(i).encode()}) for i in range(300)]
    entries += [
        (f"{deep}/ro", tarfile.DIRTYPE, {"mode": 0o555}),  # set last, deepest first
        (f"{deep}/ro/file", tarfile.REGTYPE, {"data": b"at the bottom"}),
        ("top-link", tarfile.LNKTYPE, {"link": f"{deep}/ro/file"}),
        (f"{gone}/f", tarfile.REGTYPE, {}),
        ("gone", tarfile.REGTYPE, {"data": b"a file now"}),  # the deep tree it replaces goes
        (f"{hidden}/f", tarfile.REGTYPE, {}),
        ("wh/.wh.hide", tarfile.REGTYPE, {"data": b""}),  # a whiteout of a deep tree
    ]
    blob, dest = tmp_path / "layer.tar", tmp_path / "out"
    _tar(blob, entries)
    dest.mkdir()
    proc = run_child(UNPACK, str(blob), str(dest), nofile=NOFILE)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (dest / "wide").iterdir()) == [f"w{i:03}" for i in range(300)]
    assert (dest / "wide/w299/f").read_bytes() == b"299"
    bottom = dest / deep / "ro"
    assert stat.S_IMODE(bottom.stat().st_mode) == 0o555
    assert (dest / "top-link").stat().st_ino == (bottom / "file").stat().st_ino
    assert (dest / "gone").read_bytes() == b"a file now"
    whiteout = (dest / "wh/hide").lstat()
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == os.makedev(0, 0)


ENSURE_LAYERS = """
import sys
from pathlib import Path
from hermetic.engines.unpack import ensure_layer
from hermetic.store.oci import OciStore
store = OciStore(sys.argv[1])
for layer in store.read_json(sys.argv[2])["layers"]:
    ensure_layer(store, layer["digest"], layer["mediaType"], Path(sys.argv[3]))
"""


def test_the_debian_base_layer_unpacks_within_64_descriptors(base_ref, session_cache, tmp_path):
    """The layer of the issue: 1,260 directories, which took a descriptor each (past `ulimit -n` 1024)."""
    proc = run_child(ENSURE_LAYERS, str(session_cache / "oci"), base_ref.rpartition("@")[2], str(tmp_path),
                     nofile=NOFILE, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (layer,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert (layer / "usr/bin/python3.11").is_file() and (layer / "usr/share/zoneinfo").is_dir()


# ---------------------------------------------------------------- hashing


def _dataset(root: Path, n: int = 1500) -> dict[str, str]:
    """n small files in 30 directories (more than hashing does in-process); path -> sha256."""
    digests = {}
    for i in range(n):
        p = root / f"d{i % 30}" / f"f{i}"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = f"file {i}\n".encode() * (i % 7 + 1)
        p.write_bytes(data)
        digests[str(p)] = hashlib.sha256(data).hexdigest()
    return digests


HASH_FILES = """
import json, sys
from pathlib import Path
from hermetic.data.hashfiles import hash_files
paths = sorted(str(p) for p in Path(sys.argv[1]).rglob("*") if p.is_file())
hashed = hash_files(paths, workers=int(sys.argv[2]))
print(json.dumps(dict(zip(paths, hashed.hexes()))))
"""


def test_hashing_goes_on_in_process_when_no_worker_can_be_started(tmp_path):
    """At the account's process limit the worker threads are refused; the files are hashed all the same, and
    nothing is said (`verify --full` ran into a traceback)."""
    digests = _dataset(tmp_path / "data")
    proc = run_child(HASH_FILES, str(tmp_path / "data"), "4", nproc=1)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout) == digests


def test_hashing_on_a_hundred_cores_fits_64_descriptors(tmp_path):
    """A hundred workers, each with a file open, once ran out of descriptors (a hang: the timeout is the
    failure)."""
    digests = _dataset(tmp_path / "data")
    proc = run_child(HASH_FILES, str(tmp_path / "data"), "100", nofile=NOFILE, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == digests


# ---------------------------------------------------------------- fetch


def test_fetch_at_the_process_limit_says_which_limit_in_one_line(tmp_path, cache_dir, isolated_pip):
    wheel = make_wheel(tmp_path / "src", "alpha", "1.0")
    index = make_index(tmp_path / "index", [wheel])
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hermetic.yaml").write_text("name: p\nbase: hermetic/debian-bookworm-python3@sha256:" + "a" * 64 + "\n")
    (proj / "requirements.lock").write_text(requirements_lock([("alpha", "1.0", [sha256_of(wheel)])]))
    proc = run_child(CLI, "fetch", "-C", str(proj), nproc=1, env={**os.environ, "PIP_INDEX_URL": index})
    assert_clean_error(proc, EXIT_OSERR, "cannot start a download", "`ulimit -u` is 1")


def test_charliecloud_asks_no_more_processes_than_the_account_may_have():
    """prlimit cannot raise a hard RLIMIT_NPROC: run.pids above it is capped there (as Podman's --ulimit), not a
    container that fails to start ("prlimit: failed to set the NPROC resource limit")."""
    code = ("import resource\n"
            "resource.setrlimit(resource.RLIMIT_NPROC, (200, 300))\n"
            "from hermetic.engines.base import nproc_allowed\n"
            "print(nproc_allowed(4096), nproc_allowed(64))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout.split() == ["300", "64"], proc.stderr
