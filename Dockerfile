# gds-csi image: `docker build -t <registry>/gds-csi:0.1.0 .`
#
# Stage 1: build the release binary from the locked dependency set, with the default
# features only: never `--features fault-injection` (test-only kill points, src/runtime/faults.rs).
FROM rust:bookworm AS build
WORKDIR /src
# protoc comes from the protoc-bin-vendored build dependency; no system
# protobuf compiler is needed.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY crates ./crates
COPY src ./src
# The driver and the opt-in controllers: node-loss (crates/node-loss, chart value nodeLoss)
# and the Dataset populator (crates/populator, chart value populator).
RUN cargo build --profile dist --locked -p gds-csi -p gds-csi-node-loss -p gds-csi-populator \
 && install -D -m 0755 target/dist/gds-csi /out/gds-csi \
 && install -D -m 0755 target/dist/gds-csi-node-loss /out/gds-csi-node-loss \
 && install -D -m 0755 target/dist/gds-csi-populator /out/gds-csi-populator

# Stage 2: NVIDIA's packaged cuFile (the nvidia-cufile wheel from PyPI): libcufile.so.0 and
# libcufile_rdma.so.1, unmodified, with the wheel's License.txt. The GDS gate's cuFile probe
# loads it; libcuda and the device nodes come from the host (chart: runtimeClassName nvidia,
# NVIDIA_VISIBLE_DEVICES=all). Licence basis: docs/design.md, "Dependencies and why".
FROM python:3.11-slim-bookworm AS cufile
ARG CUFILE_VERSION=1.20.0.107
RUN pip install --no-cache-dir --no-deps --target /wheel "nvidia-cufile==${CUFILE_VERSION}" \
 && lib=$(dirname "$(find /wheel/nvidia -name libcufile.so.0 | head -n1)") \
 && install -D -m 0644 -t /out/lib "$lib"/libcufile*.so* \
 && install -D -m 0644 "$(find /wheel -path '*nvidia_cufile-*.dist-info*' -name License.txt | head -n1)" \
      /out/doc/cufile-License.txt

# Stage 3: runtime with the tools the driver executes.
FROM debian:bookworm-slim
#   e2fsprogs   mkfs.ext4, tune2fs, e2fsck (ext4 volumes, data=ordered)
#   xfsprogs    mkfs.xfs, xfs_repair, xfs_growfs (xfs volumes)
#   nfs-common  mount.nfs for NFS over RDMA (vers=4.1, rdma, port=20049)
#   util-linux  mount, umount, blkid, wipefs, lsblk, findmnt
#   mdadm       creates, assembles and stops the md RAID0 arrays of `layout: stripe` volumes
#   ca-certificates  TLS roots for anything the driver fetches over HTTPS
#   libibverbs1 librdmacm1 ibverbs-providers  what libcufile_rdma.so.1 links (ldd: libibverbs,
#               librdmacm, libmlx5) for cuFile over NFS/RDMA; libcufile.so.0 needs only libstdc++
# tests/e2e/images/runtime-base.sh builds this same stage without a container engine
# (debootstrap) for the kubelet e2e test; keep its package list in step.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      e2fsprogs xfsprogs nfs-common util-linux mdadm ca-certificates \
      libibverbs1 librdmacm1 ibverbs-providers \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/gds-csi /usr/local/bin/gds-csi
COPY --from=build /out/gds-csi-node-loss /usr/local/bin/gds-csi-node-loss
COPY --from=build /out/gds-csi-populator /usr/local/bin/gds-csi-populator
COPY --from=cufile /out/lib/ /usr/local/lib/gds-csi/
COPY --from=cufile /out/doc/ /usr/share/doc/gds-csi/
# libcufile.so.0 on the loader's path for the probe (it dlopens libcuda.so.1, which the
# NVIDIA container runtime injects from the host driver).
RUN echo /usr/local/lib/gds-csi > /etc/ld.so.conf.d/gds-csi-cufile.conf && ldconfig
# No USER line: the image runs as root on purpose. A CSI node plugin calls
# mount(2)/umount(2) and propagates the mounts to the host, opens raw NVMe
# block devices for mkfs and wipefs, and runs in a privileged container
# (required for Bidirectional mount propagation); none of that works as
# non-root, and inside a privileged container a non-root user would not be a
# security boundary anyway. The chart keeps the sidecars capability-less; only
# this container is privileged.
ENTRYPOINT ["/usr/local/bin/gds-csi"]
CMD ["serve"]
