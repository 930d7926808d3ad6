"""The data dir is its owner's alone: folders 0700, files 0600, whether made now, by an older version, or later
by a server of the stack (every one is started with umask 077)."""

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077


def make_private(data_dir: Path) -> None:
    """Tighten what an earlier start (or an older version) left group- or world-readable. Symbolic links are
    neither followed nor changed, and sockets or other special files are left as their server made them."""
    for root, dirs, files in os.walk(data_dir, followlinks=False):
        _chmod(Path(root), 0o700)
        for name in dirs:
            _chmod(Path(root) / name, 0o700)
        for name in files:
            _chmod(Path(root) / name, 0o600)


def write_private(path: Path, data: bytes) -> None:
    """Created 0600 before anything is written into it, and swapped in whole."""
    write_private_together({path: data})


def write_private_together(files: dict[Path, bytes]) -> None:
    """Each file as `write_private` writes it, and all of them or none: every one is staged before any is swapped
    in (a disk that fills midway leaves the files as they were, a key never beside another start's certificate)."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            staging = path.with_suffix(path.suffix + ".tmp")
            staging.unlink(missing_ok=True)
            staged.append((staging, path))
            staging.touch(mode=0o600)
            staging.write_bytes(data)
    except OSError:
        for staging, _ in staged:
            staging.unlink(missing_ok=True)
        raise
    for staging, path in staged:
        staging.replace(path)


def _chmod(path: Path, mode: int) -> None:
    try:
        status = path.lstat()
    except FileNotFoundError:
        return  # a server removed it meanwhile
    if stat.S_ISDIR(status.st_mode) or stat.S_ISREG(status.st_mode):
        if stat.S_IMODE(status.st_mode) & ~mode:
            path.chmod(mode)
