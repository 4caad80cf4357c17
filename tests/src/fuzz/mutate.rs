//! Deterministic mutations of a valid file: bit flips, boundary bytes and numbers, truncation,
//! deleted and repeated chunks, and huge or zero little-endian lengths near the start (where
//! binary headers keep them).

/// The pipeline's SplitMix64, so a failing input can be made again from its seed.
pub struct Random(hlat_train::data::rng::SplitMix64);

impl Random {
    pub fn new(seed: u64) -> Self {
        Self(hlat_train::data::rng::SplitMix64::new(seed))
    }

    /// A value in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: usize) -> usize {
        self.0.below(bound as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Bytes that change a parser's path: delimiters of JSON and TOML, NUL, sign, high bytes.
const BOUNDARY_BYTES: &[u8] = b"\x00\xff\x7f\x80{}[]\",:.-+eE0 9\n=#'";

/// Numbers at the edges of the integer and float types.
const BOUNDARY_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1e308",
    "-1e309",
    "4294967296",
    "18446744073709551615",
    "99999999999999999999999",
    "4611686018427387904",
    "0.0000001",
    "NaN",
    "65536",
    "1000000",
];

/// Little-endian lengths at the edges: zero, huge, just past 32 bits.
const BOUNDARY_LENGTHS: &[u64] = &[0, 1, u64::MAX, u64::MAX / 2, 1 << 32, 1 << 40, 0xffff_ffff];

/// `seed` changed by one to four mutations; half of the positions fall in the first `focus`
/// bytes (a binary file's header).
pub fn mutate(seed: &[u8], focus: usize, random: &mut Random) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for _ in 0..=random.below(4) {
        if bytes.is_empty() {
            bytes.push(*random.pick(BOUNDARY_BYTES));
            continue;
        }
        let limit = if random.below(2) == 0 {
            focus.clamp(1, bytes.len())
        } else {
            bytes.len()
        };
        let at = random.below(limit);
        match random.below(7) {
            0 => bytes[at] ^= 1 << random.below(8),
            1 => bytes[at] = *random.pick(BOUNDARY_BYTES),
            2 => bytes.truncate(at),
            3 => {
                let end = (at + 1 + random.below(64)).min(bytes.len());
                bytes.drain(at..end);
            }
            4 => {
                let end = (at + 1 + random.below(64)).min(bytes.len());
                let chunk = bytes[at..end].to_vec();
                bytes.splice(at..at, chunk);
            }
            5 => replace_number(&mut bytes, at, random),
            _ => {
                let value = random.pick(BOUNDARY_LENGTHS).to_le_bytes();
                let start = at.min(bytes.len().saturating_sub(8)) & !7;
                let end = (start + 8).min(bytes.len());
                bytes[start..end].copy_from_slice(&value[..end - start]);
            }
        }
    }
    bytes
}

/// Replaces the run of digits at or after `at` (if any) with a boundary number.
fn replace_number(bytes: &mut Vec<u8>, at: usize, random: &mut Random) {
    let Some(start) = (at..bytes.len()).find(|&index| bytes[index].is_ascii_digit()) else {
        return;
    };
    let end = (start..bytes.len())
        .find(|&index| !matches!(bytes[index], b'0'..=b'9' | b'.' | b'e' | b'-'))
        .unwrap_or(bytes.len());
    let number = random.pick(BOUNDARY_NUMBERS).as_bytes().to_vec();
    bytes.splice(start..end, number);
}
