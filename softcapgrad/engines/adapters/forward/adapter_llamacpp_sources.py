"""Put llama.cpp's own converter into the llama.cpp environment, from the source distribution pip builds.

llama-cpp-python's wheel holds the compiled library only; the converter users run
(``convert_hf_to_gguf.py``, its ``conversion`` package and the ``gguf-py`` it puts first on its
path) ships in the same version's source distribution, under ``vendor/llama.cpp``. Run by the
environment's interpreter once after the install, this downloads that source distribution (pip,
``--no-binary :all:``, the version installed), and extracts those files, unchanged, into
``<environment>/share/llama.cpp-converter/``, with ``SOURCE.json`` naming the archive and its sha256.
Nothing else of the archive is unpacked; nothing of it is imported here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

PACKAGE = "llama-cpp-python"
TARGET = Path(sys.prefix) / "share" / "llama.cpp-converter"
KEEP = ("convert_hf_to_gguf.py", "LICENSE", "conversion/", "gguf-py/gguf/")


def _wanted(inner: str) -> bool:
    return any(inner == k or (k.endswith("/") and inner.startswith(k)) for k in KEEP)


def extract(archive: Path, target: Path) -> int:
    """The converter's files of ``archive`` into ``target`` (replaced whole); the count of files."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    count = 0
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            head, _, rest = member.name.partition("/vendor/llama.cpp/")
            if not rest or "/" in head or not member.isfile() or not _wanted(rest):
                continue
            member.name = rest
            tar.extract(member, staging, filter="data")
            count += 1
    if not (staging / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"reason: {archive.name} holds no vendor/llama.cpp/convert_hf_to_gguf.py")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (staging / "SOURCE.json").write_text(json.dumps({"archive": archive.name, "sha256": digest, "files": count},
                                                    indent=1, sort_keys=True) + "\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return count


def main() -> int:
    version = metadata.version(PACKAGE)
    with tempfile.TemporaryDirectory(prefix="llama-cpp-sdist-") as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               "--disable-pip-version-check", "-q", "-d", tmp, f"{PACKAGE}=={version}"],
                              stdin=subprocess.DEVNULL, cwd=tmp, check=False)
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            print(f"reason: pip download of the {PACKAGE} {version} source distribution failed "
                  f"(exit {done.returncode})", file=sys.stderr)
            return 1
        count = extract(archives[0], TARGET)
    print(f"{count} converter files of {archives[0].name} in {TARGET}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
