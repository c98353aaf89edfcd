//! The PCIe placement of `layout: stripe` against a real GPU node's sysfs: the GPUs it
//! finds are the ones `nvidia-smi` lists, and every PCI block device gets a nearness.
//! Runs where `GDS_CSI_GPU_NODE=1` (scripts/gpu-pcie.sh on the GPU machine); elsewhere
//! there is no GPU to compare with, and it returns at once.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::path::Path;
use std::process::Command;

use gds_csi::pool::inventory::Source;
use gds_csi::pool::PoolDevice;
use gds_csi::volume::block::stripe::pcie::{drive_place, gpus, nearness, Nearness};

#[test]
fn the_gpus_found_in_sysfs_are_the_ones_nvidia_smi_lists() {
    if std::env::var_os("GDS_CSI_GPU_NODE").is_none() {
        return;
    }
    let sys = Path::new("/sys");
    let found = gpus(sys);
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=pci.bus_id", "--format=csv,noheader"])
        .output()
        .expect("nvidia-smi runs on a GPU node");
    // nvidia-smi prints an 8-digit domain (`00000000:00:06.0`); sysfs a 4-digit one.
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_lowercase())
        .map(|l| l[l.len() - 12..].to_owned())
        .collect();
    listed.sort();
    let mut ours: Vec<String> = found.iter().map(|g| g.address().to_owned()).collect();
    ours.sort();
    assert!(!listed.is_empty(), "nvidia-smi listed no GPU");
    assert_eq!(ours, listed);

    let mut placed = 0;
    for e in std::fs::read_dir(sys.join("dev/block")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((major, minor)) = name.split_once(':') else {
            continue;
        };
        let dev = PoolDevice {
            id: name.clone(),
            key: format!("path:{name}"),
            path: name.clone().into(),
            size_bytes: 0,
            major: major.parse().unwrap(),
            minor: minor.parse().unwrap(),
            identity: None,
            source: Source::Listed,
        };
        let place = drive_place(sys, &dev);
        let near = nearness(place.as_ref(), &found);
        let target = std::fs::canonicalize(e.path()).unwrap();
        println!("{name:8} {:8} {}", near.name(), target.display());
        if place.is_some() {
            assert_ne!(near, Nearness::Unknown, "{name} has a PCI place");
            placed += 1;
        }
    }
    println!(
        "{} GPU(s) at {ours:?}; {placed} PCI block device(s) placed",
        found.len()
    );
}
