# gds-csi image: `docker build -t <registry>/gds-csi:0.1.0 .`
#
# Stage 1: build the release binary from the locked dependency set.
FROM rust:bookworm AS build
WORKDIR /src
# protoc comes from the protoc-bin-vendored build dependency; no system
# protobuf compiler is needed.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY crates ./crates
COPY src ./src
RUN cargo build --release --locked \
 && install -D -m 0755 target/release/gds-csi /out/gds-csi

# Stage 2: runtime with the tools the driver executes.
FROM debian:bookworm-slim
#   e2fsprogs   mkfs.ext4, tune2fs, e2fsck (ext4 volumes, data=ordered)
#   xfsprogs    mkfs.xfs, xfs_repair, xfs_growfs (xfs volumes)
#   nfs-common  mount.nfs for NFS over RDMA (vers=4.1, rdma, port=20049)
#   util-linux  mount, umount, blkid, wipefs, lsblk, findmnt
#   ca-certificates  TLS roots for anything the driver fetches over HTTPS
# tests/e2e/images/runtime-base.sh builds this same stage without a container engine
# (debootstrap) for the kubelet e2e test; keep its package list in step.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      e2fsprogs xfsprogs nfs-common util-linux ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/gds-csi /usr/local/bin/gds-csi
# No USER line: the image runs as root on purpose. A CSI node plugin calls
# mount(2)/umount(2) and propagates the mounts to the host, opens raw NVMe
# block devices for mkfs and wipefs, and runs in a privileged container
# (required for Bidirectional mount propagation); none of that works as
# non-root, and inside a privileged container a non-root user would not be a
# security boundary anyway. The chart keeps the sidecars capability-less; only
# this container is privileged.
ENTRYPOINT ["/usr/local/bin/gds-csi"]
CMD ["serve"]
