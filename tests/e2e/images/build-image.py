#!/usr/bin/env python3
"""Writes a container image as a docker-archive tarball that `ctr images import` takes.

The e2e test cannot reach an image registry, so its pause and workload images are built
here from files on this machine: one layer made from a directory, a config with the
command, and the manifest naming the image.

usage: build-image.py NAME:TAG ROOTFS_DIR OUT.tar CMD [ARG...]
"""
import hashlib
import io
import json
import sys
import tarfile


def layer_from(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        # Fixed owner and time, so the same files give the same layer digest.
        def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            return info

        tar.add(rootfs, arcname=".", filter=normalise)
    return buf.getvalue()


def main() -> None:
    name, rootfs, out, *cmd = sys.argv[1:]
    if not cmd:
        sys.exit("usage: build-image.py NAME:TAG ROOTFS_DIR OUT.tar CMD [ARG...]")
    layer = layer_from(rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(out, "w") as tar:
        for member, data in (("layer.tar", layer), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
