//! A stripe volume's sizes: each member is the md data offset plus an equal share of the
//! capacity, rounded up to the chunk and 1 MiB (both powers of two, so to the larger).

use crate::disk::gpt::ALIGN;
use crate::error::{LayoutError, Result};
use crate::request::StripeParams;

/// Room at the start of each member for the md 1.2 superblock (4 KiB in) and its bad
/// block log; the array is created with `--data-offset` of this, so the data of each
/// member is exactly `member - DATA_OFFSET` and the array's size is known in advance.
pub const DATA_OFFSET: u64 = ALIGN;

fn unit(geo: StripeParams) -> u64 {
    geo.chunk_bytes.max(ALIGN)
}

/// The size of each member partition for a capacity range (0 limit: none).
pub fn member_size(required: u64, limit: u64, geo: StripeParams) -> Result<u64> {
    let n = u64::from(geo.count);
    let unit = unit(geo);
    let share = required.div_ceil(n).max(1);
    let data = share
        .checked_next_multiple_of(unit)
        .ok_or(LayoutError::TooLarge { required })?;
    let capacity = data
        .checked_mul(n)
        .ok_or(LayoutError::TooLarge { required })?;
    if limit != 0 && capacity > limit {
        return Err(LayoutError::StripeBeyondLimit {
            members: n,
            unit,
            capacity,
            required,
            limit,
        }
        .into());
    }
    Ok(data + DATA_OFFSET)
}

/// The largest capacity N distinct devices give, from each device's largest free extent.
pub fn maximum(largest: &[u64], geo: StripeParams) -> Option<u64> {
    let n = geo.count as usize;
    if largest.len() < n {
        return None;
    }
    let mut sorted = largest.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let nth = sorted[n - 1];
    let unit = unit(geo);
    let data = nth.saturating_sub(DATA_OFFSET) / unit * unit;
    (data > 0).then(|| data * geo.count as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    const MIB: u64 = 1 << 20;

    fn geo(count: u32, chunk_kib: u64) -> StripeParams {
        StripeParams {
            count,
            chunk_bytes: chunk_kib * 1024,
        }
    }

    #[test]
    fn members_are_an_equal_share_rounded_to_chunk_and_mib_plus_the_md_offset() {
        assert_eq!(
            member_size(100 * MIB, 0, geo(4, 512)).unwrap(),
            25 * MIB + MIB
        );
        // 101 MiB / 4 = 25.25 MiB: up to 26 MiB.
        assert_eq!(
            member_size(101 * MIB, 0, geo(4, 512)).unwrap(),
            26 * MIB + MIB
        );
        // A 4 MiB chunk rounds each share to 4 MiB.
        assert_eq!(
            member_size(10 * MIB, 0, geo(2, 4096)).unwrap(),
            8 * MIB + MIB
        );
        assert_eq!(member_size(0, 0, geo(2, 64)).unwrap(), MIB + MIB);
        // Exact when required == limit and a multiple of N units.
        assert_eq!(member_size(8 * MIB, 8 * MIB, geo(2, 64)).unwrap(), 5 * MIB);
        match member_size(3 * MIB, 3 * MIB, geo(2, 64)) {
            Err(e @ Error::Layout(LayoutError::StripeBeyondLimit { .. })) => {
                assert!(e.to_string().contains("limit_bytes"), "{e}");
                assert_eq!(e.code(), tonic::Code::OutOfRange);
            }
            other => panic!("{other:?}"),
        }
        assert!(member_size(u64::MAX, 0, geo(2, 64)).is_err());
    }

    #[test]
    fn maximum_is_n_times_the_nth_largest_room_less_the_offset() {
        let rooms = [10 * MIB, 50 * MIB, 30 * MIB];
        assert_eq!(maximum(&rooms, geo(2, 512)), Some(2 * 29 * MIB));
        assert_eq!(maximum(&rooms, geo(3, 512)), Some(3 * 9 * MIB));
        assert_eq!(maximum(&rooms, geo(4, 512)), None);
        assert_eq!(maximum(&rooms, geo(3, 8192)), Some(3 * 8 * MIB));
        assert_eq!(maximum(&[MIB, MIB], geo(2, 512)), None);
        // What the maximum promises is what member_size then asks of each device.
        let max = maximum(&rooms, geo(2, 512)).unwrap();
        assert!(member_size(max, max, geo(2, 512)).unwrap() <= 30 * MIB);
    }
}
