//! Request-to-domain conversion: capabilities, StorageClass parameters, names, volume ids
//! and host paths built from arbitrary strings. Whatever is accepted must be safe to hand
//! to mount(8) and the filesystem.
#![no_main]

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use arbitrary::Arbitrary;
use gds_csi::csi;
use gds_csi::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use gds_csi::request::{self, Access};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    mode: Option<i32>,
    access: u8,
    fs_type: &'a str,
    flags: Vec<&'a str>,
    group: &'a str,
    params: Vec<(&'a str, &'a str)>,
    path: &'a str,
    roots: Vec<&'a str>,
    id: &'a str,
    name: &'a str,
}

fn check_accepted_flag(flag: &str) {
    assert!(!flag.is_empty());
    assert!(!flag.contains([',', ' ', '\n', '\0']), "{flag:?}");
    assert!(!flag.chars().any(char::is_control), "{flag:?}");
    let key = flag.split('=').next().unwrap_or(flag);
    assert!(key != "data" || flag == "data=ordered", "{flag:?}");
    assert!(
        !matches!(key, "bind" | "rbind" | "remount" | "move"),
        "{flag:?}"
    );
}

fuzz_target!(|input: Input| {
    let cap = csi::VolumeCapability {
        access_mode: input.mode.map(|mode| AccessMode { mode }),
        access_type: match input.access % 3 {
            0 => None,
            1 => Some(AccessType::Block(BlockVolume {})),
            _ => Some(AccessType::Mount(MountVolume {
                fs_type: input.fs_type.into(),
                mount_flags: input.flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: input.group.into(),
            })),
        },
    };
    if let Ok(Some(parsed)) = request::capability(&cap, "volume_capability") {
        if parsed.access == Access::Block {
            assert!(parsed.mount_flags.is_empty());
        }
        for flag in &parsed.mount_flags {
            check_accepted_flag(flag);
        }
    }
    let _ = request::capabilities(std::slice::from_ref(&cap));

    let params: HashMap<String, String> = input
        .params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Ok(p) = request::parameters(&params) {
        for (k, v) in &p.stored {
            assert!(
                matches!(
                    k.as_str(),
                    "fsType"
                        | "gdsPolicy"
                        | "layout"
                        | "server"
                        | "share"
                        | "subDir"
                        | "onDelete"
                        | "stripeCount"
                        | "stripeChunk"
                ),
                "{k:?}"
            );
            assert!(!v.contains([',', '=', '\n', '\0']), "{v:?}");
        }
        // NFS-only keys only with a server, and a block layout never with one.
        let has = |k: &str| p.stored.contains_key(k);
        if has("share") || has("subDir") || has("onDelete") {
            assert!(has("server"), "{:?}", p.stored);
        }
        assert!(!(has("server") && has("layout")), "{:?}", p.stored);
        // Stripe geometry only with layout: stripe, and then always parsed.
        let stripe = p.stored.get("layout").map(String::as_str) == Some("stripe");
        if has("stripeCount") || has("stripeChunk") {
            assert!(stripe, "{:?}", p.stored);
        }
        assert_eq!(p.stripe.is_some(), stripe, "{:?}", p.stored);
    }

    if let Ok(n) = request::name(input.name) {
        assert!(!n.is_empty() && n.len() <= 128 && !n.chars().any(char::is_control));
    }
    let _ = request::volume_ref(input.id);
    // A snapshot id that parses names a directory without `/` or a leading `.` and
    // prints back to itself, so DeleteSnapshot never reaches outside its store.
    if let Some(id) = request::snapshot::SnapshotId::parse(input.id) {
        assert!(!id.dir.contains('/') && !id.dir.starts_with('.'), "{id:?}");
        assert_eq!(id.to_string(), input.id, "{id:?}");
    }

    let roots: Vec<PathBuf> = input.roots.iter().map(PathBuf::from).collect();
    if let Ok(p) = request::host_path("target_path", input.path, &roots) {
        assert!(p.is_absolute(), "{p:?}");
        assert!(
            !p.components().any(|c| matches!(c, Component::ParentDir)),
            "{p:?}"
        );
        assert!(
            roots.iter().any(|r| p.starts_with(r)),
            "{p:?} outside {roots:?}"
        );
        assert_eq!(p, Path::new(input.path));
        assert!(!input.path.chars().any(char::is_control));
    }
});
