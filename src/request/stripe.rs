//! The `stripe` layout's StorageClass parameters: `stripeCount` members of
//! md RAID0 and its `stripeChunk`. Both apply to `layout: stripe` only.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

pub const PARAM_STRIPE_COUNT: &str = "stripeCount";
pub const PARAM_STRIPE_CHUNK: &str = "stripeChunk";

/// Members of one array: at least two (one member is the partition layout), at most 16
/// (more drives than a GPU node carries behind one CPU socket).
pub const MIN_MEMBERS: u32 = 2;
pub const MAX_MEMBERS: u32 = 16;

const KIB: u64 = 1024;
/// mdadm refuses a chunk below 4 KiB (mdadm.c: `s.chunk < 8` sectors is
/// "invalid chunk/rounding value"); its upper bound (INT_MAX sectors) is far above what
/// a stripe needs. The bound is what mkfs can align to: ext4's stride holds 128 MiB at
/// most (`os::mkfs::MAX_CHUNK`).
pub const MIN_CHUNK: u64 = 4 * KIB;
pub const MAX_CHUNK: u64 = crate::os::mkfs::MAX_CHUNK;
/// mdadm's own default chunk for RAID0 with 1.2 metadata (mdadm man page, `--chunk`):
/// large enough that a 1 MiB GDS read spans two members at most.
pub const DEFAULT_CHUNK: u64 = 512 * KIB;

/// A stripe volume's geometry, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeParams {
    pub count: u32,
    /// Bytes, a power of two within [MIN_CHUNK, MAX_CHUNK].
    pub chunk_bytes: u64,
}

/// `stripeCount`/`stripeChunk`: required and validated for `layout: stripe`, refused on
/// any other layout (None then).
pub fn stripe_params(
    params: &BTreeMap<String, String>,
    is_stripe: bool,
) -> Result<Option<StripeParams>> {
    if !is_stripe {
        for key in [PARAM_STRIPE_COUNT, PARAM_STRIPE_CHUNK] {
            if params.contains_key(key) {
                return Err(Error::invalid(
                    field(key),
                    "applies to layout: stripe only; add layout: stripe or drop it",
                ));
            }
        }
        return Ok(None);
    }
    let count = match params.get(PARAM_STRIPE_COUNT) {
        None => {
            return Err(Error::invalid(
                field(PARAM_STRIPE_COUNT),
                format!(
                    "required with layout: stripe; give the number of drives to stripe \
                     over ({MIN_MEMBERS} to {MAX_MEMBERS})"
                ),
            ))
        }
        Some(v) => count(v)?,
    };
    let chunk_bytes = match params.get(PARAM_STRIPE_CHUNK) {
        None => DEFAULT_CHUNK,
        Some(v) => chunk(v)?,
    };
    Ok(Some(StripeParams { count, chunk_bytes }))
}

fn field(key: &str) -> &'static str {
    if key == PARAM_STRIPE_COUNT {
        "parameters.stripeCount"
    } else {
        "parameters.stripeChunk"
    }
}

fn count(v: &str) -> Result<u32> {
    let n = v
        .parse::<u32>()
        .ok()
        .filter(|n| (MIN_MEMBERS..=MAX_MEMBERS).contains(n));
    n.ok_or_else(|| {
        Error::invalid(
            field(PARAM_STRIPE_COUNT),
            format!("{v:?} must be an integer from {MIN_MEMBERS} to {MAX_MEMBERS}"),
        )
    })
}

/// `<n>`, `<n>K`/`<n>KiB` (KiB, as mdadm's `--chunk`) or `<n>M`/`<n>MiB`.
fn chunk(v: &str) -> Result<u64> {
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, ""),
    };
    let scale = match unit {
        "" | "K" | "k" | "KiB" => Some(KIB),
        "M" | "m" | "MiB" => Some(KIB * KIB),
        _ => None,
    };
    let bytes = scale
        .zip(digits.parse::<u64>().ok())
        .and_then(|(s, n)| n.checked_mul(s))
        .filter(|b| b.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(b));
    bytes.ok_or_else(|| {
        Error::invalid(
            field(PARAM_STRIPE_CHUNK),
            format!(
                "{v:?} must be a power of two from 4 KiB to 128 MiB, in KiB (\"512\", \
                 \"512K\") or MiB (\"1M\"); leave it out for {} KiB",
                DEFAULT_CHUNK / KIB
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)], stripe: bool) -> Result<Option<StripeParams>> {
        let m = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        stripe_params(&m, stripe)
    }

    fn field_of(r: Result<Option<StripeParams>>) -> &'static str {
        match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("not InvalidArgument: {other:?}"),
        }
    }

    #[test]
    fn count_and_chunk_are_checked_and_named() {
        let ok = parse(&[("stripeCount", "4")], true).unwrap().unwrap();
        assert_eq!((ok.count, ok.chunk_bytes), (4, 512 * KIB));
        for (v, bytes) in [
            ("4", 4 * KIB),
            ("64K", 64 * KIB),
            ("1M", 1 << 20),
            ("128M", 1 << 27),
        ] {
            let p = parse(&[("stripeCount", "2"), ("stripeChunk", v)], true);
            assert_eq!(p.unwrap().unwrap().chunk_bytes, bytes, "{v}");
        }
        assert_eq!(field_of(parse(&[], true)), "parameters.stripeCount");
        for bad in ["1", "17", "0", "-2", "2.0", "two", "", "99999999999"] {
            let p = parse(&[("stripeCount", bad)], true);
            assert_eq!(field_of(p), "parameters.stripeCount", "{bad:?}");
        }
        for bad in [
            "2",
            "0",
            "48",
            "3K",
            "2G",
            "2048M",
            "256M",
            "1T",
            "K",
            "",
            "18446744073709551615M",
        ] {
            let p = parse(&[("stripeCount", "2"), ("stripeChunk", bad)], true);
            assert_eq!(field_of(p), "parameters.stripeChunk", "{bad:?}");
        }
    }

    #[test]
    fn stripe_keys_belong_to_the_stripe_layout_only() {
        assert_eq!(parse(&[], false).unwrap(), None);
        let p = parse(&[("stripeCount", "2")], false);
        assert_eq!(field_of(p), "parameters.stripeCount");
        let p = parse(&[("stripeChunk", "64")], false);
        assert_eq!(field_of(p), "parameters.stripeChunk");
    }
}
