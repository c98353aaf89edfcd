use super::*;
use crate::disk::gpt::format::{ENTRIES, ENTRIES_BEFORE, MAX_PARTITION_NUMBER};

const MIB: u64 = ALIGN;
const GIB: u64 = 1 << 30;

fn label(mib: u64) -> Label {
    Label::new(
        512,
        mib * MIB / 512,
        crate::disk::gpt::format::new_disk_guid(),
    )
    .unwrap()
}

fn range(required: u64, limit: u64) -> SizeRange {
    SizeRange { required, limit }
}

#[test]
fn size_for_a_capacity_range() {
    // Exact when required == limit and aligned.
    assert_eq!(range(5 * MIB, 5 * MIB).size(GIB).unwrap(), 5 * MIB);
    // Rounded up to whole MiB.
    assert_eq!(range(MIB + 1, 0).size(GIB).unwrap(), 2 * MIB);
    assert_eq!(range(1, 0).size(GIB).unwrap(), MIB);
    // No aligned size in [required, limit]: OutOfRange naming the fix.
    let e = range(MIB + 1, MIB + 2).size(GIB).unwrap_err();
    assert!(
        matches!(&e, Error::NoSizeInRange(m) if m.contains("multiple of 1048576")),
        "{e}"
    );
    assert!(matches!(
        range(3 * MIB, 2 * MIB).size(GIB),
        Err(Error::NoSizeInRange(_))
    ));
    // Unset: the default, capped at a limit, rounded down into it.
    assert_eq!(range(0, 0).size(GIB).unwrap(), GIB);
    assert_eq!(range(0, 10 * MIB + 7).size(GIB).unwrap(), 10 * MIB);
    assert_eq!(range(0, 3 * MIB / 2).size(GIB).unwrap(), MIB);
    assert!(matches!(
        range(0, MIB - 1).size(GIB),
        Err(Error::NoSizeInRange(_))
    ));
    assert!(matches!(
        range(u64::MAX, 0).size(GIB),
        Err(Error::NoSizeInRange(_))
    ));
}

#[test]
fn an_empty_label_has_one_aligned_extent() {
    let l = label(64);
    // GPT needs 34 sectors at the start and 33 at the end: the first and last MiB go.
    assert_eq!(
        l.free_extents(),
        vec![Extent {
            start: MIB,
            len: 62 * MIB
        }]
    );
    assert_eq!(l.capacity(), (62 * MIB, 62 * MIB));
}

#[test]
fn placement_keeps_room_to_grow_after_each_partition() {
    let mut l = label(64);
    let a = l.allocate("a", 4 * MIB).unwrap();
    let b = l.allocate("b", 2 * MIB).unwrap();
    let c = l.allocate("c", 8 * MIB).unwrap();
    let at = |l: &Label, n: u32| l.extent(n).unwrap().start / MIB;
    assert_eq!(
        (at(&l, a), at(&l, b), at(&l, c)),
        (1, 7, 10),
        "each one past its predecessor's room (half the predecessor's size)"
    );
    assert_eq!(a, 1, "the lowest free slot");
    assert!(l.grow(a, 6 * MIB).unwrap(), "a grows into its room");
    assert!(l.grow(b, 3 * MIB).unwrap(), "and b into its own");
    assert!(l.grow(a, 7 * MIB).is_err(), "but not into b");
    let err = l.allocate("g", 60 * MIB).unwrap_err();
    assert!(
        matches!(err, Error::NoSpace { wanted, largest } if wanted == 60 * MIB && largest == 45 * MIB),
        "{err}"
    );
    assert!(
        matches!(
            l.allocate("c", MIB),
            Err(Error::NameTaken { number, .. }) if number == c
        ),
        "names are unique"
    );
    assert!(matches!(
        l.allocate("x".repeat(37).as_str(), MIB),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(l.allocate("h", MIB + 512), Err(Error::Invalid(_))));
}

#[test]
fn the_smallest_hole_that_keeps_every_room_is_taken_first() {
    let mut l = label(256);
    let sizes = [("a", 4), ("b", 8), ("c", 16), ("d", 4), ("e", 4)];
    let n: Vec<u32> = sizes
        .iter()
        .map(|(name, mib)| l.allocate(name, mib * MIB).unwrap())
        .collect();
    let starts: Vec<u64> = n
        .iter()
        .map(|&n| l.extent(n).unwrap().start / MIB)
        .collect();
    assert_eq!(starts, [1, 7, 19, 43, 49]);
    l.remove(n[1]); // a 14 MiB hole after a (which wants 2 MiB of room)
    l.remove(n[3]); // a 14 MiB hole after c (which wants 8)
    let x = l.allocate("x", 2 * MIB).unwrap();
    assert_eq!(
        l.extent(x).unwrap().start,
        7 * MIB,
        "the first of the two smallest holes, past a's room, not the large free end"
    );
    let y = l.allocate("y", 6 * MIB).unwrap();
    assert_eq!(
        l.extent(y).unwrap().start,
        10 * MIB,
        "the rest of the hole after a keeps x's room and y's own; after c it would not"
    );
}

#[test]
fn when_room_runs_short_the_slack_is_shared_and_every_claim_that_fits_is_carved() {
    let mut l = label(64); // 62 MiB usable
    let a = l.allocate("a", 30 * MIB).unwrap();
    assert_eq!(l.extent(a).unwrap().start, MIB);
    // 32 MiB follow a, which wants 15 of room, the new one 10: the 12 spare MiB are
    // shared 15:10.
    let b = l.allocate("b", 20 * MIB).unwrap();
    assert_eq!(l.extent(b).unwrap().start, 38 * MIB);
    let (free, largest) = l.capacity();
    assert_eq!((free, largest), (12 * MIB, 7 * MIB));
    let c = l.allocate("c", largest).unwrap();
    assert_eq!(
        l.extent(c).unwrap().start,
        31 * MIB,
        "a claim as large as the largest free extent is still carved"
    );
    let d = l.allocate("d", 5 * MIB).unwrap();
    assert_eq!(l.extent(d).unwrap().start, 58 * MIB);
}

#[test]
fn twenty_four_claims_on_a_4_gib_drive_each_grow_by_half_in_place() {
    let mut l = label(4096);
    let sizes: Vec<u64> = (0..24).map(|i| (64 + (i * 37) % 97) * MIB).collect();
    let carved: u64 = sizes.iter().sum();
    assert!(carved > 2 * GIB + GIB / 2, "{carved}");
    let parts: Vec<u32> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| l.allocate(&format!("v{i}"), size).unwrap())
        .collect();
    for (i, n) in parts.into_iter().enumerate() {
        let now = l.extent(n).unwrap().len;
        let wanted = (now * 3 / 2).next_multiple_of(MIB);
        assert!(l.grow(n, wanted).unwrap(), "claim {i}: {now} -> {wanted}");
    }
}

#[test]
fn grow_in_place_or_name_the_neighbour() {
    let mut l = label(64);
    let a = l.allocate("a", 4 * MIB).unwrap();
    let b = l.allocate("b", 4 * MIB).unwrap();
    let c = l.allocate("c", 50 * MIB).unwrap();
    assert_eq!(l.extent(c).unwrap().start, 11 * MIB);
    let err = l.grow(a, 7 * MIB).unwrap_err();
    assert!(
        err.to_string()
            .contains("partition 2 (\"b\") starts at byte 7340032"),
        "{err}"
    );
    l.remove(b);
    assert!(l.grow(a, 8 * MIB).unwrap(), "6 free MiB follow a");
    assert!(
        !l.grow(a, 8 * MIB).unwrap(),
        "already that large: nothing to do"
    );
    assert!(!l.grow(a, 2 * MIB).unwrap(), "never shrinks");
    assert_eq!(
        l.extent(a).unwrap(),
        Extent {
            start: MIB,
            len: 8 * MIB
        }
    );
    let err = l.grow(a, 11 * MIB).unwrap_err();
    assert!(
        err.to_string()
            .contains("partition 3 (\"c\") starts at byte 11534336"),
        "{err}"
    );
    assert!(l.grow(a, 10 * MIB).unwrap());
    let err = l.grow(c, 60 * MIB).unwrap_err();
    assert!(err.to_string().contains("usable space ends"), "{err}");
    assert!(l.grow(c, 52 * MIB).unwrap());
    assert_eq!(l.capacity(), (0, 0));
    assert!(matches!(l.grow(7, 2 * MIB), Err(Error::NotInLabel(_))));
}

/// xorshift64*: a reproducible stream without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The room the partition right before `gap` wants (none at the usable start).
fn room_before(l: &Label, gap: &Extent) -> u64 {
    l.partitions()
        .map(|(n, _)| l.extent(n).unwrap())
        .filter(|e| e.end() <= gap.start && e.end().next_multiple_of(ALIGN) == gap.start)
        .map(|e| growth_room(e.len))
        .max()
        .unwrap_or(0)
}

/// No overlaps, all aligned and inside the usable span, free + used == usable, and
/// the free extents are exactly the gaps.
fn check_invariants(l: &Label) {
    let usable = l.usable();
    let mut used: Vec<Extent> = l.partitions().map(|(n, _)| l.extent(n).unwrap()).collect();
    used.sort();
    for u in &used {
        assert_eq!(u.start % ALIGN, 0);
        assert_eq!(u.len % ALIGN, 0);
        assert!(u.start >= usable.start && u.end() <= usable.end());
    }
    for w in used.windows(2) {
        assert!(w[0].end() <= w[1].start, "overlap: {w:?}");
    }
    let free = l.free_extents();
    let (total, largest) = l.capacity();
    let used_bytes: u64 = used.iter().map(|u| u.len).sum();
    assert_eq!(total + used_bytes, usable.len);
    assert_eq!(largest, free.iter().map(|e| e.len).max().unwrap_or(0));
    for f in &free {
        assert!(
            used.iter()
                .all(|u| f.end() <= u.start || u.end() <= f.start),
            "free overlaps used"
        );
    }
}

#[test]
fn random_allocations_keep_the_invariants_and_the_room() {
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut l = label(256 + rng.below(768));
        for step in 0..300 {
            let numbers: Vec<u32> = l.partitions().map(|(n, _)| n).collect();
            match rng.below(4) {
                0 | 1 => {
                    let size = (1 + rng.below(48)) * MIB;
                    let free = l.free_extents();
                    let fits: Vec<&Extent> = free.iter().filter(|e| e.len >= size).collect();
                    // Gaps where the partition before and the new one keep their room.
                    let roomy: Vec<&Extent> = fits
                        .iter()
                        .copied()
                        .filter(|g| g.len >= room_before(&l, g) + size + growth_room(size))
                        .collect();
                    match l.allocate(&format!("s{seed}n{step}"), size) {
                        Ok(n) => {
                            let got = l.extent(n).unwrap();
                            assert_eq!(got.len, size);
                            let hole = free
                                .iter()
                                .find(|g| g.start <= got.start && got.end() <= g.end())
                                .expect("inside a free extent");
                            if let Some(best) = roomy.iter().map(|g| g.len).min() {
                                assert_eq!(
                                    hole.len, best,
                                    "seed {seed} step {step}: not the smallest roomy gap"
                                );
                                assert_eq!(got.start, hole.start + room_before(&l, hole));
                            }
                        }
                        Err(Error::NoSpace { .. }) => {
                            assert!(
                                fits.is_empty() || numbers.len() == MAX_PARTITION_NUMBER as usize,
                                "seed {seed} step {step}"
                            )
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                2 if !numbers.is_empty() => {
                    l.remove(numbers[rng.below(numbers.len() as u64) as usize]);
                }
                _ if !numbers.is_empty() => {
                    let n = numbers[rng.below(numbers.len() as u64) as usize];
                    let now = l.extent(n).unwrap();
                    let _ = l.grow(n, now.len + (1 + rng.below(8)) * MIB);
                }
                _ => {}
            }
            check_invariants(&l);
        }
    }
}

#[test]
fn choose_prefers_the_device_that_keeps_growth_room() {
    use crate::disk::gpt::volume::choose;
    use std::path::PathBuf;
    let mut small = label(64);
    small.allocate("x", 58 * MIB).unwrap(); // leaves 4 MiB
    let big = label(256);
    let labels = vec![
        (PathBuf::from("/dev/a"), big, Default::default()),
        (PathBuf::from("/dev/b"), small, Default::default()),
    ];
    let (dev, at) = choose(&labels, 3 * MIB).unwrap();
    assert_eq!(
        (dev, at.start),
        (PathBuf::from("/dev/a").as_path(), MIB),
        "not squeezed into x's room on /dev/b"
    );
    let mut roomy = label(64);
    roomy.allocate("y", 8 * MIB).unwrap(); // [1, 9), room 4: 50 MiB after it
    let labels = vec![
        labels[0].clone(),
        (PathBuf::from("/dev/c"), roomy, Default::default()),
    ];
    let (dev, at) = choose(&labels, 3 * MIB).unwrap();
    assert_eq!(
        (dev, at.start),
        (PathBuf::from("/dev/c").as_path(), 13 * MIB),
        "the smaller gap that keeps every room"
    );
    assert!(choose(&labels, 300 * MIB).is_none());
}

#[test]
fn a_label_with_every_entry_used_offers_nothing() {
    let mut l = label(512);
    assert_eq!(l.slots.len(), ENTRIES);
    for i in 0..MAX_PARTITION_NUMBER {
        l.allocate(&format!("p{i}"), MIB).unwrap();
    }
    // Entry 256 is in the array but the kernel would not register its partition.
    assert!(l.slots[ENTRIES - 1].is_none());
    assert!(l.free_extents().is_empty(), "no entry: nothing to carve");
    assert_eq!(l.capacity(), (0, 0));
    let err = l.allocate("one-more", MIB).unwrap_err();
    assert!(
        matches!(err, Error::NoEntry { entries } if entries == 255),
        "{err}"
    );
    assert!(err.to_string().contains("255"), "{err}");
    // A label of the earlier format: 128 partitions.
    let mut before = crate::disk::gpt::Label::with_entries(
        512,
        256 * MIB / 512,
        crate::disk::gpt::format::new_disk_guid(),
        ENTRIES_BEFORE,
    )
    .unwrap();
    for i in 0..ENTRIES_BEFORE {
        before.allocate(&format!("p{i}"), MIB).unwrap();
    }
    assert!(matches!(
        before.allocate("one-more", MIB),
        Err(Error::NoEntry { entries: 128 })
    ));
    // An entry freed, or a number held, counts.
    l.remove(7);
    assert_eq!(l.free_slot(&Held::default()), Some(7));
    let held = Held {
        numbers: vec![7],
        spans: Vec::new(),
    };
    assert_eq!(l.free_slot(&held), None);
    assert!(l.free_extents_clear_of(&held).is_empty());
    // Numbers no entry has (0, past the label) hold nothing.
    let odd = Held {
        numbers: vec![0, 300, u32::MAX],
        spans: Vec::new(),
    };
    assert_eq!(l.free_slot(&odd), Some(7));
    use crate::disk::gpt::volume::choose;
    let full = (std::path::PathBuf::from("/dev/full"), l.clone(), held);
    let blank = (
        std::path::PathBuf::from("/dev/b"),
        label(64),
        Held::default(),
    );
    let labels = [full, blank];
    let (dev, _) = choose(&labels, MIB).unwrap();
    assert_eq!(
        dev,
        std::path::Path::new("/dev/b"),
        "a full label is passed over"
    );
}
