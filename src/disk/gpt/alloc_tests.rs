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
fn best_fit_takes_the_smallest_hole_that_holds_it() {
    let mut l = label(64);
    let a = l.allocate("a", 4 * MIB).unwrap();
    let _b = l.allocate("b", 2 * MIB).unwrap();
    let c = l.allocate("c", 8 * MIB).unwrap();
    let _d = l.allocate("d", 2 * MIB).unwrap();
    l.remove(a); // a 4 MiB hole at 1 MiB
    l.remove(c); // an 8 MiB hole at 7 MiB
    let e = l.allocate("e", 3 * MIB).unwrap();
    assert_eq!(
        l.extent(e).unwrap().start,
        MIB,
        "the 4 MiB hole, not the 8 MiB one"
    );
    assert_eq!(e, 1, "the lowest free slot");
    let f = l.allocate("f", 6 * MIB).unwrap();
    assert_eq!(l.extent(f).unwrap().start, 7 * MIB);
    let err = l.allocate("g", 60 * MIB).unwrap_err();
    assert!(
        matches!(err, Error::NoSpace { wanted, largest } if wanted == 60 * MIB && largest == 46 * MIB),
        "{err}"
    );
    assert!(
        matches!(
            l.allocate("f", MIB),
            Err(Error::NameTaken { number, .. }) if number == f
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
fn grow_in_place_or_name_the_neighbour() {
    let mut l = label(64);
    let a = l.allocate("a", 4 * MIB).unwrap();
    let b = l.allocate("b", 4 * MIB).unwrap();
    let c = l.allocate("c", 50 * MIB).unwrap();
    assert_eq!(l.extent(c).unwrap().start, 9 * MIB);
    let err = l.grow(a, 5 * MIB).unwrap_err();
    assert!(
        err.to_string()
            .contains("partition 2 (\"b\") starts at byte 5242880"),
        "{err}"
    );
    l.remove(b);
    assert!(l.grow(a, 8 * MIB).unwrap(), "4 free MiB follow a");
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
    let err = l.grow(a, 9 * MIB).unwrap_err();
    assert!(
        err.to_string()
            .contains("partition 3 (\"c\") starts at byte 9437184"),
        "{err}"
    );
    let err = l.grow(c, 60 * MIB).unwrap_err();
    assert!(err.to_string().contains("usable space ends"), "{err}");
    assert!(l.grow(c, 54 * MIB).unwrap());
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
fn random_allocations_keep_the_invariants_and_fit_best() {
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
                    match l.allocate(&format!("s{seed}n{step}"), size) {
                        Ok(n) => {
                            let got = l.extent(n).unwrap();
                            let best = fits.iter().map(|e| e.len).min().unwrap();
                            let hole = free.iter().find(|e| e.start == got.start).unwrap();
                            assert_eq!(hole.len, best, "seed {seed} step {step}: not the best fit");
                            assert_eq!(got.len, size);
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
fn choose_picks_the_best_hole_across_devices() {
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
        (PathBuf::from("/dev/b").as_path(), 59 * MIB)
    );
    let (dev, _) = choose(&labels, 5 * MIB).unwrap();
    assert_eq!(dev, PathBuf::from("/dev/a").as_path());
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
