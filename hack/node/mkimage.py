"""Write a container image as a docker-archive tarball (the format ``docker save`` writes) from
root filesystem tarballs, with no container engine and no registry: the test lab's real node
(tests/support/node.py) loads it into its containerd with ``ctr images import``.

Usage::

    mkimage.py --tag localhost/x:1 --layer rootfs.tar [--layer more.tar ...] [--entrypoint JSON]
               [--cmd JSON] [--env K=V ...] [--workdir /] [--user UID:GID] -o image.tar

Layers are uncompressed tarballs of root filesystems, applied in order. The image's creation time
is fixed, so the same layers and settings always give the same image ID.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Sequence

CREATED = "1970-01-01T00:00:00Z"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", required=True)
    parser.add_argument("--layer", action="append", required=True)
    parser.add_argument("--entrypoint", help="a JSON list")
    parser.add_argument("--cmd", help="a JSON list")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--workdir", default="/")
    parser.add_argument("--user", default="")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)

    diff_ids = [sha256_file(layer) for layer in args.layer]
    config: dict[str, object] = {"Env": args.env or [DEFAULT_PATH], "WorkingDir": args.workdir}
    if args.entrypoint:
        config["Entrypoint"] = json.loads(args.entrypoint)
    if args.cmd:
        config["Cmd"] = json.loads(args.cmd)
    if args.user:
        config["User"] = args.user
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": CREATED,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
        "history": [{"created": CREATED, "created_by": "hack/node/mkimage.py"} for _ in diff_ids],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [
        {"Config": config_name, "RepoTags": [args.tag], "Layers": [f"{d}/layer.tar" for d in diff_ids]}
    ]
    repository, _, tag = args.tag.rpartition(":")

    partial = args.output + ".tmp"
    with tarfile.open(partial, "w") as archive:
        for layer, diff_id in zip(args.layer, diff_ids, strict=True):
            archive.add(layer, arcname=f"{diff_id}/layer.tar")
        _add_bytes(archive, config_name, config_bytes)
        _add_bytes(archive, "manifest.json", json.dumps(manifest).encode())
        _add_bytes(archive, "repositories", json.dumps({repository: {tag: diff_ids[-1]}}).encode())
    os.replace(partial, args.output)
    size = os.path.getsize(args.output) / 1e6
    print(f"{args.output}: {args.tag}, {len(diff_ids)} layer(s), {size:.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
