//! What a verdict means: the `gdsPolicy` of a volume, and what the gate does with a report
//! under it. Pure: no files, no probe, no state.

use std::fmt;

use gds_check::{Check, Report};

use crate::error::{Error, Result};

/// The StorageClass parameter that selects the policy.
pub const PARAM: &str = "gdsPolicy";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Required,
    Preferred,
    Disabled,
}

impl Policy {
    /// The policy of a volume from its stored parameters. Absent means `required`: a volume is
    /// published only once the nvidia_fs and cuFile checks pass unless its class turns the gate
    /// off (`gdsPolicy: disabled`, as csi-sanity and the test rigs do).
    pub fn from_parameters<'a, I>(params: I) -> Result<Policy>
    where
        I: IntoIterator<Item = (&'a String, &'a String)>,
    {
        match params.into_iter().find(|(k, _)| k.as_str() == PARAM) {
            None => Ok(Policy::Required),
            Some((_, v)) => v.parse(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Required => "required",
            Policy::Preferred => "preferred",
            Policy::Disabled => "disabled",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Policy> {
        match s {
            "required" => Ok(Policy::Required),
            "preferred" => Ok(Policy::Preferred),
            "disabled" => Ok(Policy::Disabled),
            // The same refusal as a bad value in CreateVolume's parameters.
            other => Err(Error::invalid(
                "parameters",
                format!("{PARAM} {other:?} must be required, preferred or disabled"),
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the gate decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `disabled`: nothing was checked.
    Skipped,
    /// Every check passed: true GDS.
    Ready,
    /// `preferred` and something failed: published, cuFile will run in compat mode (or not at
    /// all); the string says why.
    Compat(String),
}

/// The verdict on a volume whose checks produced `report`. `required` refuses a failed
/// report with FAILED_PRECONDITION naming every failed check, one per line; `preferred`
/// publishes it in compat mode, saying why. `disabled` never gets here (nothing is checked).
pub fn judge(policy: Policy, volume_id: &str, report: &Report) -> Result<Verdict> {
    if policy == Policy::Disabled {
        return Ok(Verdict::Skipped);
    }
    if report.ready() {
        return Ok(Verdict::Ready);
    }
    let failed = report.failures().len();
    let lines = failure_lines(report) + &volume_warnings(report);
    match policy {
        Policy::Required => Err(Error::GdsRequired {
            volume: volume_id.to_owned(),
            failed,
            lines,
        }),
        _ => Ok(Verdict::Compat(format!(
            "GDS in compat mode ({PARAM}=preferred): {failed} check(s) failed: {}",
            lines.replace('\n', "; ")
        ))),
    }
}

/// `check-id: evidence -> remedy`, one line.
pub fn failure_line(c: &Check) -> String {
    let evidence = if c.evidence.is_empty() {
        c.summary.as_str()
    } else {
        c.evidence.as_str()
    };
    let evidence = evidence.replace('\n', " ");
    match &c.remedy {
        Some(r) => format!("{}: {evidence} -> {r}", c.id),
        None => format!("{}: {evidence}", c.id),
    }
}

/// The volume's own warnings, one `warning: ` line each after a newline: what makes this
/// volume compat-only when its checks pass but the probe fails (a volume on a loop device,
/// or a partition of one, is no NVMe namespace: `volume.nvme_transport`), so a refusal
/// names the cause and not only the probe's answer.
fn volume_warnings(report: &Report) -> String {
    report
        .warnings()
        .iter()
        .filter(|c| c.id.starts_with("volume."))
        .map(|c| format!("\nwarning: {}", failure_line(c)))
        .collect()
}

/// Every failed check of `report`, one [`failure_line`] each, joined by newlines.
pub fn failure_lines(report: &Report) -> String {
    report
        .failures()
        .iter()
        .map(|c| failure_line(c))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn policy_defaults_to_required() {
        let mut p = BTreeMap::new();
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Required);
        p.insert("fsType".to_string(), "ext4".to_string());
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Required);
        p.insert(PARAM.to_string(), "disabled".to_string());
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Disabled);
        p.insert(PARAM.to_string(), "preferred".to_string());
        assert_eq!(Policy::from_parameters(&p).unwrap(), Policy::Preferred);
        p.insert(PARAM.to_string(), "maybe".to_string());
        assert!(Policy::from_parameters(&p).is_err());
    }

    fn failing() -> Report {
        Report::new(vec![
            Check::pass("gpu.driver", "GPU", "0000:18:00.0"),
            Check::fail("volume.udev", "udev", "no entry\nfor 259:0", "run udevd"),
            Check::fail("cufile.probe", "probe", "", "see the code"),
        ])
    }

    #[test]
    fn required_refuses_naming_each_failure_and_preferred_says_why() {
        let Err(err @ Error::GdsRequired { .. }) = judge(Policy::Required, "vol-1", &failing())
        else {
            panic!("required must refuse a failed report")
        };
        let msg = err.to_string();
        let lines: Vec<&str> = msg.lines().collect();
        assert!(lines[0].contains("vol-1") && lines[0].contains("2 check(s) failed"));
        assert_eq!(
            &lines[1..],
            [
                "volume.udev: no entry for 259:0 -> run udevd",
                "cufile.probe: probe -> see the code"
            ]
        );
        let Ok(Verdict::Compat(why)) = judge(Policy::Preferred, "vol-1", &failing()) else {
            panic!("preferred must publish in compat mode")
        };
        assert_eq!(
            why,
            "GDS in compat mode (gdsPolicy=preferred): 2 check(s) failed: \
             volume.udev: no entry for 259:0 -> run udevd; cufile.probe: probe -> see the code"
        );
    }

    #[test]
    fn a_passing_report_is_ready_and_disabled_is_skipped() {
        let ok = Report::new(vec![Check::pass("gpu.driver", "GPU", "x")]);
        for p in [Policy::Required, Policy::Preferred] {
            assert_eq!(judge(p, "v", &ok).unwrap(), Verdict::Ready);
        }
        assert_eq!(
            judge(Policy::Disabled, "v", &failing()).unwrap(),
            Verdict::Skipped
        );
    }
}
