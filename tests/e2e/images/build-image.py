#!/usr/bin/env python3
"""Writes a container image as an archive that docker, podman and `ctr images import` load.

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
        write_archive(args.name, args.out, layers, config)


def blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


def write_archive(name: str, out: str, layers: list, config: bytes) -> None:
    # An OCI image layout (oci-layout, index.json, blobs/) with docker's manifest.json
    # naming the same blobs: the archive `docker save` writes since Docker 25, which
    # docker load, podman load and ctr images import all read.
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest, "size": os.path.getsize(path)} for _, path, digest in layers],
    }).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": len(manifest),
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
        }],
    }).encode()
    docker_manifest = json.dumps([{
        "Config": blob_name(config_digest),
        "RepoTags": [name],
        "Layers": [blob_name(digest) for _, _, digest in layers],
    }]).encode()
    files = [(blob_name(config_digest), config), (blob_name(manifest_digest), manifest),
             ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index),
             ("manifest.json", docker_manifest)]
    with tarfile.open(out, "w") as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        written = set()
        for _, path, digest in layers:
            if digest not in written:
                tar.add(path, arcname=blob_name(digest))
                written.add(digest)
        for member, data in files:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

if __name__ == "__main__":
    main()
