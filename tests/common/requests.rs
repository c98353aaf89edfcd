//! CSI requests the root and in-process tests send again and again.

use std::path::Path;

use gds_csi::csi::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use gds_csi::csi::Clients;
use gds_csi::csi::*;

/// `mode` access to a raw block volume (`block`) or an ext4-by-default mount.
pub fn capability(mode: Mode, block: bool) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        }),
    }
}

/// The capability most tests use: one node writes a mounted filesystem.
pub fn single_writer_mount() -> VolumeCapability {
    capability(Mode::SingleNodeWriter, false)
}

/// Creates `name` for one writer. There is no GPU here: the GDS gate (on by default) is
/// turned off explicitly.
pub fn create_without_gds(name: &str, cap: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![cap],
        parameters: [("gdsPolicy".to_string(), "disabled".to_string())].into(),
        ..Default::default()
    }
}

/// Sends `req`, which must succeed, and returns the new volume.
pub async fn create_volume(c: &mut Clients, req: CreateVolumeRequest) -> Volume {
    c.controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// Sends `create_without_gds` and returns the new volume's id.
pub async fn create_volume_id(c: &mut Clients, name: &str, cap: VolumeCapability) -> String {
    create_volume(c, create_without_gds(name, cap))
        .await
        .volume_id
}

pub fn stage_request(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn publish_request(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        target_path: target.to_str().unwrap().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

pub fn unpublish_request(id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_str().unwrap().into(),
    }
}

pub fn unstage_request(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
    }
}

pub fn delete_request(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

/// The node calls, for tests that look only at success or the error.
pub async fn stage(
    c: &mut Clients,
    id: &str,
    staging: &Path,
    cap: VolumeCapability,
) -> Result<(), tonic::Status> {
    c.node
        .node_stage_volume(stage_request(id, staging, cap))
        .await
        .map(drop)
}

pub async fn unstage(c: &mut Clients, id: &str, staging: &Path) -> Result<(), tonic::Status> {
    c.node
        .node_unstage_volume(unstage_request(id, staging))
        .await
        .map(drop)
}

pub async fn publish(
    c: &mut Clients,
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) -> Result<(), tonic::Status> {
    c.node
        .node_publish_volume(publish_request(id, staging, target, cap))
        .await
        .map(drop)
}

/// Stage (the staging directory created first, as the kubelet does) and publish; panics
/// on a failure: for tests whose subject comes after.
pub async fn stage_and_publish(
    c: &mut Clients,
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) {
    std::fs::create_dir_all(staging).expect("staging dir");
    stage(c, id, staging, cap.clone()).await.expect("stage");
    publish(c, id, staging, target, cap).await.expect("publish");
}

pub async fn unpublish(c: &mut Clients, id: &str, target: &Path) -> Result<(), tonic::Status> {
    c.node
        .node_unpublish_volume(unpublish_request(id, target))
        .await
        .map(drop)
}

/// GetCapacity with no parameters: what the whole pool has free.
pub async fn capacity(c: &mut Clients) -> GetCapacityResponse {
    c.controller
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
}

/// NodeGetVolumeStats of `id` published at `target`.
pub async fn published_stats(
    c: &mut Clients,
    id: &str,
    target: &Path,
) -> NodeGetVolumeStatsResponse {
    c.node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: target.to_str().unwrap().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The parameters of a `layout: partition` class without GDS.
pub fn partition_params() -> std::collections::HashMap<String, String> {
    [
        ("gdsPolicy".to_string(), "disabled".to_string()),
        ("layout".to_string(), "partition".to_string()),
    ]
    .into()
}

/// CreateVolume of a `layout: partition` volume of `bytes` for one writer, without GDS.
pub fn partition_create(name: &str, bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![single_writer_mount()],
        parameters: partition_params(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}
