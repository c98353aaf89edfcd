//! Volume ids: every node and controller call decodes one sent by the CO.
#![no_main]

use gds_csi::request::{self, VolumeRef};
use gds_csi::csi::id::{self as volume_id, BlockVolumeId, MAX_VOLUME_ID_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|id: &str| {
    if let Some(parsed) = BlockVolumeId::parse(id) {
        assert_eq!(parsed.to_string(), id, "decoding is exact");
    }
    let _ = volume_id::check_node_id(id);
    if let Ok(v) = request::volume_ref(id) {
        // Whatever gets past the gate is safe to log, compare and look up.
        assert!(!id.is_empty() && id.len() <= MAX_VOLUME_ID_LEN);
        assert!(!id.contains("..") && !id.contains('/'));
        assert!(!id.chars().any(char::is_control));
        assert_eq!(v.raw(), id);
        if let VolumeRef::Block(b) = v {
            assert_eq!(BlockVolumeId::parse(&b.to_string()), Some(b));
        }
    } else {
        assert!(volume_id::check_well_formed("volume_id", id).is_err());
    }
});
