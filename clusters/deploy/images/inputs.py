"""The inputs of the node image and their hash, which names the image: `pulsar-chaos-node:<hash>`.

Standard library only: build.sh runs it with the system python3 before any virtualenv exists, and
clusters/deploy/docker.py loads it to find the image built from the sources as they are now.

The inputs are what `pip install .` needs (pyproject.toml, README.md and the package folders that
pyproject.toml's [tool.setuptools.packages.find] includes: this folder is one of them, so the
Dockerfile, build.sh and packages.txt count too) and the host's extra CA certificates, which the
image trusts. Tests, docs, results, .venv and .git are not inputs: editing them rebuilds nothing.

    python3 inputs.py hash  [REPO]        print the hash of the inputs as they are now
    python3 inputs.py stage DEST [REPO]   copy them into the build context DEST (and the dependencies
                                          of pyproject.toml into DEST/deps/requirements.txt); print
                                          the hash of exactly what was copied (a file edited meanwhile
                                          cannot make the tag lie about the image's content)
"""
from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

IMAGES = Path(__file__).resolve().parent
REPO = IMAGES.parents[2]
CA_DIR = Path("/usr/local/share/ca-certificates")
TAG_CHARS = 12
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", "build"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".swp", "~", ".tmp")


def _packages(repo: Path) -> list[str]:
    """Top-level package folders named by pyproject's `include = ["harness*", ...]`."""
    meta = tomllib.loads((repo / "pyproject.toml").read_text())
    include = meta.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {}).get("include", [])
    names = sorted({re.sub(r"[.*].*$", "", pattern) for pattern in include} - {""})
    return [n for n in names if (repo / n).is_dir()]


def _walk(folder: Path) -> Iterator[Path]:
    for p in sorted(folder.iterdir()):
        if p.is_dir():
            if p.name not in SKIP_DIRS and not p.name.endswith(".egg-info"):
                yield from _walk(p)
        elif p.is_file() and not p.name.endswith(SKIP_SUFFIXES) and ".tmp" not in p.name:
            yield p


def files(repo: Path = REPO) -> list[tuple[str, Path]]:
    """(name in the build context, file on this host) of every input, in a stable order."""
    out = [(f"src/{n}", repo / n) for n in ("pyproject.toml", "README.md") if (repo / n).is_file()]
    for pkg in _packages(repo):
        out += [(f"src/{p.relative_to(repo)}", p) for p in _walk(repo / pkg)]
    out += [(f"certs/{p.name}", p) for p in sorted(CA_DIR.glob("*.crt"))]
    out += [(name, IMAGES / name) for name in ("Dockerfile", "packages.txt")]
    return out


def _digest(entries: Iterator[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in entries:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:TAG_CHARS]


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:           # deleted since it was listed: not an input any more
        return None


def input_hash(repo: Path = REPO) -> str:
    return _digest((name, data) for name, path in files(repo) if (data := _read(path)) is not None)


def stage(dest: Path, repo: Path = REPO) -> str:
    """Copy the inputs into the build context `dest`; return the hash of the bytes copied."""
    def copied() -> Iterator[tuple[str, bytes]]:
        for name, path in files(repo):
            if (data := _read(path)) is None:
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            yield name, data
    (dest / "certs").mkdir(parents=True, exist_ok=True)     # COPY needs it even when there is no cert
    digest = _digest(copied())
    # the dependencies alone, for the image's dependency layer: editing the rest of pyproject.toml
    # (pytest settings...) reuses it
    meta = tomllib.loads((dest / "src" / "pyproject.toml").read_text())
    (dest / "deps").mkdir(exist_ok=True)
    (dest / "deps" / "requirements.txt").write_text("".join(f"{d}\n" for d in meta["project"]["dependencies"]))
    return digest


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "hash":
        print(input_hash(Path(argv[1]) if len(argv) > 1 else REPO))
        return 0
    if len(argv) >= 2 and argv[0] == "stage":
        print(stage(Path(argv[1]), Path(argv[2]) if len(argv) > 2 else REPO))
        return 0
    print(__doc__.split("\n\n")[-1].rstrip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
