"""``hermetic fetch``: every locked wheel for the target into the wheel store. A wheel the store holds is never
fetched again (no network at all); otherwise the sources in order (the lock's URLs, its indexes, pip's
find-links and indexes), a silent one skipped with a note; the best tag whose hash the lock allows is hashed on
its way in.
"""

from __future__ import annotations

import html.parser
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import unquote, urljoin, urlsplit

from packaging.utils import InvalidWheelFilename, canonicalize_name, canonicalize_version, parse_wheel_filename

from hermetic.core.errors import (EXIT_DATAERR, EXIT_NOINPUT, EXIT_UNAVAILABLE, DiskFull, HermeticError, IntegrityError,
                             TempFail, Unavailable)
from hermetic.core.transfer import MAX_TIMEOUT_S, MIN_RATE_ENV, RATE_WINDOW_ENV, Watch, min_rate, new_session, watch_requests
from hermetic.lock.indexes import PipSources
from hermetic.lock.model import Lock, LockedWheel, ResolvedWheel, Target
from hermetic.lock.tags import wheel_priority
from hermetic.store.wheels import StoredWheel, WheelStore
from hermetic.core.workers import limit_reached

_SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tgz")
_JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


class FetchError(Unavailable):
    """A locked wheel could not be fetched (the index or the network is unavailable, or it has no such wheel)."""


@dataclass(frozen=True)
class Candidate:
    filename: str
    url: str  # http(s)://… or file://… or a local path
    sha256: str | None
    source: str


@dataclass
class FetchReport:
    resolved: list[ResolvedWheel]
    downloaded: list[str] = field(default_factory=list)  # filenames fetched this time
    bytes_downloaded: int = 0
    notes: list[str] = field(default_factory=list)


def resolve_from_store(lock: Lock, store: WheelStore) -> tuple[list[ResolvedWheel], list[LockedWheel]]:
    """(wheels found in the store, pins still missing) — no network."""
    found, missing = [], []
    for w in lock.wheels:  # the stored file for each pin that an installer in the image would pick
        ranked = [(wheel_priority(sw.path.name, lock.target), sw) for sw in store.find_any(w.sha256s)]
        ranked = [(p, sw) for p, sw in ranked if p is not None]
        sw = min(ranked, key=lambda r: r[0])[1] if ranked else None
        if sw is None:
            missing.append(w)
        else:
            found.append(sw.resolved(w))
    return found, missing


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self.links.append((self._href, ""))

    def handle_data(self, data: str) -> None:
        if self._href is not None and self.links:
            href, text = self.links[-1]
            self.links[-1] = (href, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._href = None


class SourceSet:
    """Indexes and find-links locations, queried at most once per package."""

    def __init__(self, sources: PipSources, lock: Lock, *, timeout: float = 30.0):
        self.lock = lock
        self.timeout = timeout
        self._session = None
        self._session_lock = threading.Lock()
        self.min_rate = min_rate()  # (bytes/s, window s) each download must keep
        self.unreachable: set[str] = set()
        self._pages: dict[tuple[str, str], list[Candidate] | None] = {}
        self._mu = threading.Lock()
        self.find_links = list(lock.find_links) + [f for f in sources.find_links if f not in lock.find_links]
        self.indexes = list(lock.index_urls) + [i for i in sources.indexes() if i not in lock.index_urls]

    def session(self):
        with self._session_lock:
            if self._session is None:
                self._session = new_session()  # one a download's Watch can cut (its minimum rate)
                self._session.headers["User-Agent"] = "hermetic (+wheel fetch)"
            return self._session

    # -- listing --------------------------------------------------------
    def candidates(self, wheel: LockedWheel) -> Iterable[tuple[str, list[Candidate]]]:
        """(source label, candidates) in the order sources are tried."""
        if wheel.urls:
            direct = [Candidate(u.rsplit("/", 1)[-1].split("#")[0], u, None, "lock") for u in wheel.urls]
            yield "the lock's file URLs", direct
        per_pkg = [wheel.index] if wheel.index else []
        for loc in self.find_links:
            yield f"find-links {loc}", self._once((loc, ""), lambda: self._find_links(loc)) or []
        for idx in per_pkg + [i for i in self.indexes if i not in per_pkg]:
            yield f"index {idx}", self._once((idx, wheel.name), lambda: self._index_page(idx, wheel.name)) or []

    def _once(self, key: tuple[str, str], ask: Callable[[], list[Candidate] | None]) -> list[Candidate] | None:
        """A source's answer for ``key``, asked at most once (two downloads at once may both ask)."""
        with self._mu:
            if key in self._pages:
                return self._pages[key]
        answer = ask()
        with self._mu:
            self._pages[key] = answer
        return answer

    def _find_links(self, loc: str) -> list[Candidate]:
        out: list[Candidate] = []
        path = loc[len("file://"):] if loc.startswith("file://") else loc
        if "://" not in path:
            p = Path(path)
            if p.is_dir():
                out = [Candidate(n, str(p / n), None, f"find-links {loc}") for n in sorted(os.listdir(p))]
            elif p.is_file() and p.suffix in (".html", ".htm"):
                out = self._parse_html(p.read_text(errors="replace"), p.as_uri(), loc)
        else:
            resp = self._get(loc, accept="text/html")
            if resp is not None and resp.status_code == 200:
                out = self._parse_html(resp.text, loc, loc)
        return out

    def _index_page(self, index: str, name: str) -> list[Candidate] | None:
        base = index.rstrip("/") + "/" + canonicalize_name(name) + "/"
        result: list[Candidate] | None = None
        if base.startswith("file://") or "://" not in base:
            d = Path(unquote(urlsplit(base).path) if base.startswith("file://") else base)
            page = d / "index.html"
            if page.is_file():
                result = self._parse_html(page.read_text(errors="replace"), page.as_uri(), index)
        else:
            resp = self._get(base, accept=_JSON_ACCEPT)
            if resp is not None and resp.status_code == 200:
                ctype = resp.headers.get("Content-Type", "")
                if "json" in ctype:
                    doc = resp.json()
                    result = [
                        Candidate(f["filename"], urljoin(resp.url, f["url"]), (f.get("hashes") or {}).get("sha256"), f"index {index}")
                        for f in doc.get("files", [])
                    ]
                else:
                    result = self._parse_html(resp.text, resp.url, index)
            elif resp is not None and resp.status_code == 404:
                result = []
        return result

    def _parse_html(self, text: str, base_url: str, label: str) -> list[Candidate]:
        parser = _Anchors()
        parser.feed(text)
        out = []
        for href, anchor_text in parser.links:
            if not href:
                continue
            url = urljoin(base_url, href)
            frag = urlsplit(url).fragment
            sha = None
            if frag.startswith("sha256="):
                sha = frag[len("sha256="):].lower()
            filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or anchor_text.strip()
            out.append(Candidate(filename, url.split("#")[0], sha, label))
        return out

    def _get(self, url: str, accept: str):
        import requests

        host = urlsplit(url).netloc
        if host in self.unreachable:
            return None
        try:
            return self.session().get(url, headers={"Accept": accept}, timeout=self.timeout)
        except requests.RequestException:
            with self._mu:
                self.unreachable.add(host)
            return None


def _same_pin(name: str, version: str, wheel: LockedWheel) -> bool:
    return canonicalize_name(name) == wheel.name and (canonicalize_version(version)
                                                      == canonicalize_version(wheel.version))


def _matches(c: Candidate, wheel: LockedWheel) -> bool:
    try:
        name, version, _build, _tags = parse_wheel_filename(c.filename)
    except InvalidWheelFilename:
        return False
    return _same_pin(name, str(version), wheel)


def _is_sdist_of(c: Candidate, wheel: LockedWheel) -> bool:
    stem = next((c.filename[:-len(s)] for s in _SDIST_SUFFIXES if c.filename.endswith(s)), None)
    name, _, version = (stem or "").rpartition("-")
    return stem is not None and _same_pin(name, version, wheel)


def choose(wheel: LockedWheel, sources: SourceSet, target: Target) -> tuple[Candidate | None, list[str]]:
    """The best candidate file for a pin; when there is none, notes say what was seen instead.

    The notes say what is true of the files found: wheels for the image whose
    hashes the lock does not allow come first (that is a lock made from other
    files: re-lock), then wheels for other platforms or Pythons, then sdists.
    """
    unlocked: set[str] = set()  # for the image, but their hashes are not the lock's
    incompatible: set[str] = set()
    sdists: set[str] = set()
    for label, cands in sources.candidates(wheel):
        best: tuple[int, Candidate] | None = None
        for c in cands:
            if _is_sdist_of(c, wheel):
                sdists.add(c.filename)
                continue
            if not c.filename.endswith(".whl") or not _matches(c, wheel):
                continue
            prio = wheel_priority(c.filename, target)
            if prio is None:
                incompatible.add(c.filename)
                continue
            if c.sha256 is not None and c.sha256 not in wheel.sha256s:
                unlocked.add(c.filename)
                continue
            if best is None or prio < best[0]:
                best = (prio, c)
        if best is not None:
            return best[1], []
    return None, _not_found_notes(wheel, target, unlocked, incompatible, sdists)


def _some(names: set[str], n: int = 3) -> str:
    listed = sorted(names)
    return ", ".join(listed[:n]) + (f" (+{len(listed) - n} more)" if len(listed) > n else "")


def _not_found_notes(wheel: LockedWheel, target: Target, unlocked: set[str], incompatible: set[str],
                     sdists: set[str]) -> list[str]:
    image = f"{target.platform} / CPython {target.python_version}"
    if unlocked:
        return [f"{len(unlocked)} wheel(s) for {image} exist ({_some(unlocked)}), but their hashes are not in the "
                f"lock (its {len(wheel.sha256s)} hash(es) for this pin are of other files: it was locked for another "
                f"platform, or the files changed); re-lock for the image with `hermetic lock`"]
    if incompatible:
        return [f"no wheel for {image}; only wheels for other platforms or Pythons: {_some(incompatible)}"
                + (f", and an sdist ({_some(sdists, 1)}), which needs a build, which is not hermetic" if sdists else "")]
    if sdists:
        return [f"only an sdist ({_some(sdists, 1)}) was found; sdists need a build, which is not hermetic"]
    return []


def fetch(lock: Lock, store: WheelStore, sources: PipSources, *, jobs: int = 4,
          progress: Callable[[str, int, int | None], None] | None = None,
          offline: bool = False) -> FetchReport:
    """Bring every pin into the store. ``progress(filename, bytes_delta, total)``."""
    found, missing = resolve_from_store(lock, store)
    report = FetchReport(resolved=list(found))
    if not missing:
        return report
    if offline:
        names = ", ".join(f"{w.name}=={w.version}" for w in missing[:5])
        raise FetchError(f"not in the wheel store and the network is off: {names}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""),
                         hint="run `hermetic fetch` where the indexes are reachable")
    srcs = SourceSet(sources, lock)
    lock_mu = threading.Lock()

    def one(w: LockedWheel) -> ResolvedWheel:
        cand, notes = choose(w, srcs, lock.target)
        if cand is None:
            where = w.source or lock.path
            if notes:
                raise FetchError(f"{where}: {w.name}=={w.version}: {'; '.join(notes)}", exit_code=EXIT_DATAERR)
            tried = [*srcs.find_links, *srcs.indexes]
            why = f"not found in {', '.join(tried) or 'any source'}"
            down = sorted(srcs.unreachable)
            if down:
                why += f" (unreachable: {', '.join(down)})"
            raise FetchError(f"{where}: {w.name}=={w.version}: no wheel for {lock.target.platform} / CPython "
                             f"{lock.target.python_version}: {why}", exit_code=EXIT_UNAVAILABLE if down else EXIT_NOINPUT)
        tick = (lambda n: progress(cand.filename, n, None)) if progress else (lambda n: None)
        got = _download(cand, store, w, f"{w.name}=={w.version}", srcs, tick).resolved(w)
        with lock_mu:
            report.downloaded.append(got.filename)
            report.bytes_downloaded += got.size or 0
        return got

    errors: list[HermeticError] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            futures = {pool.submit(one, w): w for w in missing}  # (each submit may start a thread)
        except RuntimeError as e:  # the downloads already started end first (the pool's exit waits for them)
            raise limit_reached(e, "cannot start a download") or e
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            try:
                report.resolved.append(fut.result())
            except HermeticError as e:
                errors.append(e)
                if isinstance(e, DiskFull):  # the next downloads would fill nothing but time
                    for other in futures:
                        other.cancel()
    if errors:
        # Integrity failures first: they matter most. Then, of downloads that found the disk full (they run
        # side by side, so which fails first is chance), the one that needed the most: the one that did not fit.
        errors.sort(key=lambda e: (0, 0) if isinstance(e, IntegrityError) else
                    (1, -(e.needed or 0)) if isinstance(e, DiskFull) else (2, 0))
        first = errors[0]
        if len(errors) > 1:
            first.message += f" (and {len(errors) - 1} more package(s) failed)"
        raise first
    report.resolved.sort(key=lambda r: r.locked.name)
    if srcs.unreachable:
        report.notes.append(f"unreachable and skipped: {', '.join(sorted(srcs.unreachable))}")
    return report


def _download(c: Candidate, store: WheelStore, w: LockedWheel, what: str, srcs: SourceSet,
              tick: Callable[[int], None]) -> StoredWheel:
    url = c.url
    if url.startswith("file://") or "://" not in url:
        path = Path(unquote(urlsplit(url).path)) if url.startswith("file://") else Path(url)
        with open(path, "rb") as f:
            return store.admit_stream(f.read, c.filename, w.sha256s, what=what, on_bytes=tick,
                                       size=os.fstat(f.fileno()).st_size)
    import requests
    import urllib3.exceptions

    rate, window = srcs.min_rate
    watch = Watch(time.monotonic() + MAX_TIMEOUT_S, (rate, window))  # no deadline: the rate and read timeout
    watch_requests(watch)
    resp = None

    def moved(n: int) -> None:
        watch.moved(n)
        tick(n)

    try:
        resp = srcs.session().get(url, stream=True, timeout=srcs.timeout)
        with resp:
            if resp.status_code != 200:
                raise FetchError(f"{what}: download of {c.filename} failed: HTTP {resp.status_code} from "
                                 f"{urlsplit(url).netloc}")
            resp.raw.decode_content = True  # what iter_content would do
            length = resp.headers.get("Content-Length", "")
            return store.admit_stream(resp.raw.read, c.filename, w.sha256s, what=what, on_bytes=moved,
                                      size=int(length) if length.isdigit() else None)
    except (requests.RequestException, urllib3.exceptions.HTTPError, IntegrityError) as e:
        if watch.fired:  # its socket shut: whatever the read then saw (an error, a short body)
            raise TempFail(f"{what}: download of {c.filename} from {c.source}: {watch.seen:.0f} bytes/s over the "
                           f"last {window:g} s, below the minimum of {rate:g} bytes/s ({MIN_RATE_ENV}, "
                           f"{RATE_WINDOW_ENV}); nothing stored", hint="the index is stalled or too slow; try "
                           f"again later, or lower {MIN_RATE_ENV} (0: no minimum)") from None
        if isinstance(e, IntegrityError):
            raise
        raise FetchError(f"{what}: download of {c.filename} {'failed' if resp is None else 'interrupted'}: "
                         f"{e.__class__.__name__}") from None
    finally:
        watch.close()
        watch_requests(None)

