//! The clone copies' figures: bytes copied and to copy and the copy's
//! duration per volume, failures by cause.

use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::error::{CloneError, CopyError, Error};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    pub volume: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

#[derive(Default)]
pub struct CloneMetrics {
    pub copied: Family<VolumeLabels, Gauge>,
    pub total: Family<VolumeLabels, Gauge>,
    pub seconds: Family<VolumeLabels, Gauge<f64, AtomicU64>>,
    pub freeze_seconds: Family<VolumeLabels, Gauge<f64, AtomicU64>>,
    pub failures: Family<CauseLabels, Counter>,
}

static CLONES: LazyLock<CloneMetrics> = LazyLock::new(CloneMetrics::default);

fn volume(v: &str) -> VolumeLabels {
    VolumeLabels {
        volume: v.to_owned(),
    }
}

/// Where a clone's copy stands now.
pub fn progress(vol: &str, copied: u64, total: u64) {
    CLONES.copied.get_or_create(&volume(vol)).set(copied as i64);
    CLONES.total.get_or_create(&volume(vol)).set(total as i64);
}

/// The copy ended after `seconds` (this process's part of it).
pub fn finished(vol: &str, seconds: f64) {
    CLONES.seconds.get_or_create(&volume(vol)).set(seconds);
}

/// The clone's source, in use, was frozen `seconds` for the copy's last pass.
pub fn frozen(vol: &str, seconds: f64) {
    CLONES
        .freeze_seconds
        .get_or_create(&volume(vol))
        .set(seconds);
}

/// Why a copy failed: the `cause` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The NFS source stopped answering.
    SourceTimeout,
    /// The copy differs from its source.
    Verify,
    /// The source or the clone is in use, so no consistent copy could be made.
    InUse,
    /// Mounting the source or the clone failed.
    Mount,
    /// Reading, writing or creating what is copied failed.
    Copy,
    Other,
}

impl Cause {
    /// The cause of a failed copy, chosen by the error's variant.
    pub fn of(e: &Error) -> Cause {
        match e {
            Error::Copy(CopyError::SourceTimeout { .. }) => Cause::SourceTimeout,
            Error::Copy(CopyError::Differs { .. }) => Cause::Verify,
            Error::Copy(CopyError::InUse { .. })
            | Error::Clone(CloneError::RawSourceInUse { .. })
            | Error::Clone(CloneError::StripeSourceInUse { .. }) => Cause::InUse,
            Error::Mount(_) => Cause::Mount,
            Error::Io { .. } | Error::Volume(_) => Cause::Copy,
            Error::Shared(inner) => Cause::of(inner),
            _ => Cause::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Cause::SourceTimeout => "source_timeout",
            Cause::Verify => "verify",
            Cause::InUse => "in_use",
            Cause::Mount => "mount",
            Cause::Copy => "copy",
            Cause::Other => "other",
        }
    }
}

/// A copy failed with `e`.
pub fn failed(e: &Error) {
    failed_because(Cause::of(e));
}

/// A copy failed for a cause the caller knows from the step that failed.
pub fn failed_because(cause: Cause) {
    CLONES
        .failures
        .get_or_create(&CauseLabels {
            cause: cause.label(),
        })
        .inc();
}

/// A deleted clone's series go.
pub fn forget(vol: &str) {
    CLONES.copied.remove(&volume(vol));
    CLONES.total.remove(&volume(vol));
    CLONES.seconds.remove(&volume(vol));
    CLONES.freeze_seconds.remove(&volume(vol));
}

pub fn register(r: &mut Registry) {
    r.register(
        "gds_csi_clone_copied_bytes",
        "Bytes a clone's copy has written, per volume",
        CLONES.copied.clone(),
    );
    r.register(
        "gds_csi_clone_total_bytes",
        "Bytes a clone's copy has to write, per volume",
        CLONES.total.clone(),
    );
    r.register(
        "gds_csi_clone_duration_seconds",
        "How long a clone's copy took in this driver process, per volume",
        CLONES.seconds.clone(),
    );
    r.register(
        "gds_csi_clone_freeze_seconds",
        "How long a clone's source in use was frozen for the copy's last pass, per volume",
        CLONES.freeze_seconds.clone(),
    );
    r.register(
        "gds_csi_clone_failures",
        "Clone copies that failed, by cause",
        CLONES.failures.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_the_variant_whatever_the_message_says() {
        let differs = Error::Copy(CopyError::Differs {
            copy: "a file that is in use".into(),
            at: " at byte 0".into(),
        });
        assert_eq!(Cause::of(&differs), Cause::Verify);
        let in_use = Error::Copy(CopyError::InUse {
            what: "the source volume v".into(),
            uses: "mounted at /x".into(),
            fix: "stop it",
        });
        assert_eq!(Cause::of(&in_use), Cause::InUse);
        // The old text matches would have called these a verify failure and an in-use one.
        let worded = Error::State {
            path: "/x".into(),
            reason: "the copy differs from its source; x is in use ".into(),
        };
        assert_eq!(Cause::of(&worded), Cause::Other);
        let timeout = CopyError::SourceTimeout {
            label: "192.0.2.1:/e/a".into(),
            soft_seconds: 60,
            error: "timed out".into(),
            percent: 40,
            copied_gib: 0.4,
            total_gib: 1.0,
        };
        let shared = Error::Shared(std::sync::Arc::new(timeout.into()));
        assert_eq!(Cause::of(&shared), Cause::SourceTimeout);
        assert_eq!(tonic::Status::from(shared).code(), tonic::Code::Unavailable);
        assert_eq!(Cause::InUse.label(), "in_use");
    }
}
