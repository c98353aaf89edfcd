#!/usr/bin/env python3
"""Writes a container image as a docker-archive tarball that `ctr images import` takes.

The e2e tests cannot reach an image registry, so their images are built here from files
on this machine: layers made from directories (or taken from tarballs as they are), a
config with the entrypoint and command, and the manifest naming the image.

usage: build-image.py NAME:TAG OUT.tar --layer DIR|TAR [--layer ...] [--entrypoint PATH] [CMD ...]
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile


def tar_of_directory(rootfs: str, out: str) -> None:
    # Fixed owner and time, so the same files give the same layer digest.
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(rootfs, arcname=".", filter=normalise)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("out")
    parser.add_argument("--layer", action="append", required=True, help="a directory or an uncompressed tar")
    parser.add_argument("--entrypoint")
    parser.add_argument("cmd", nargs="*")
    args = parser.parse_intermixed_args()

    with tempfile.TemporaryDirectory() as scratch:
        layers = []
        for i, source in enumerate(args.layer):
            if os.path.isdir(source):
                path = os.path.join(scratch, f"layer{i}.tar")
                tar_of_directory(source, path)
            else:
                path = source
            layers.append((f"layer{i}.tar", path, sha256_of(path)))
        config_body = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
        if args.entrypoint:
            config_body["Entrypoint"] = [args.entrypoint]
        if args.cmd:
            config_body["Cmd"] = args.cmd
        config = json.dumps({
            "architecture": "amd64",
            "os": "linux",
            "config": config_body,
            "rootfs": {"type": "layers", "diff_ids": [digest for _, _, digest in layers]},
        }).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        manifest = json.dumps([{
            "Config": config_name,
            "RepoTags": [args.name],
            "Layers": [member for member, _, _ in layers],
        }]).encode()
        with tarfile.open(args.out, "w") as tar:
            for member, path, _ in layers:
                tar.add(path, arcname=member)
            for member, data in ((config_name, config), ("manifest.json", manifest)):
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
