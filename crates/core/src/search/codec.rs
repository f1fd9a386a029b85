//! The stored form of a [`TermVector`]: about two bytes a term.
//!
//! Keys are uniform over [`TERM_KEYS`] and ascending, so the gaps between
//! them are close to geometric: each gap is Rice-coded with the parameter
//! that suits the vector's size (the quotient in unary, then `k` low
//! bits). Most terms appear once, so each frequency follows its key as
//! `0` for 1, `10` for 2, `110` for 3, and `111` then eight bits for more.
//!
//! Layout: the length (varint), the entry count (varint), `k` (one byte),
//! then the bits, most significant first, padded with zeros to a byte.

use super::{TERM_KEYS, TermVector};
use crate::varint;

/// Encodes a well-formed vector.
pub fn encode(vector: &TermVector) -> Vec<u8> {
    let n = vector.entries.len();
    let mut out = Vec::with_capacity(8 + n * 2 + n / 4);
    varint::put(&mut out, u64::from(vector.length));
    varint::put(&mut out, n as u64);
    let k = rice_parameter(n);
    out.push(k);
    let mut bits = BitWriter {
        out,
        pending: 0,
        used: 0,
    };
    let mut next = 0u32;
    for &e in &vector.entries {
        let key = e >> 8;
        let gap = key.saturating_sub(next);
        next = key + 1;
        bits.push_ones(gap >> k);
        // A zero, then the gap's `k` low bits.
        bits.push_low(gap & ((1 << k) - 1), u32::from(k) + 1);
        match e & 0xff {
            0 | 1 => bits.push_low(0b0, 1),
            2 => bits.push_low(0b10, 2),
            3 => bits.push_low(0b110, 3),
            f => bits.push_low(0b111 << 8 | f, 11),
        }
    }
    bits.finish()
}

/// Decodes what [`encode`] wrote; a description of the first problem
/// otherwise.
pub fn decode(bytes: &[u8]) -> Result<TermVector, String> {
    let mut entries = Vec::new();
    let length = walk(bytes, |key, frequency| {
        entries.push((key << 8) | frequency);
        true
    })?;
    Ok(TermVector { length, entries })
}

/// The length of the stored vector and the frequency of each of `keys`
/// in it (0 where absent), reading only as far as the largest of them.
pub fn frequencies(bytes: &[u8], keys: &[u32]) -> Result<(u32, Vec<u32>), String> {
    let mut found = vec![0u32; keys.len()];
    let last = keys.iter().copied().max().unwrap_or(0);
    let length = walk(bytes, |key, frequency| {
        for (slot, &k) in found.iter_mut().zip(keys) {
            if k == key {
                *slot = frequency;
            }
        }
        key < last
    })?;
    Ok((length, found))
}

/// Reads the header, then calls `visit` with each entry's key and
/// frequency, in key order, while it returns true. Returns the length.
/// A stream read to its end must end exactly at its last byte.
fn walk(bytes: &[u8], mut visit: impl FnMut(u32, u32) -> bool) -> Result<u32, String> {
    let mut at = 0;
    let length = varint::get(bytes, &mut at).ok_or("a truncated length")?;
    let n = varint::get(bytes, &mut at).ok_or("a truncated entry count")?;
    let length = u32::try_from(length).map_err(|_| format!("a length of {length}"))?;
    if n > u64::from(TERM_KEYS) {
        return Err(format!("{n} entries, more than there are keys"));
    }
    let k = u32::from(*bytes.get(at).ok_or("no Rice parameter")?);
    if k > 20 {
        return Err(format!("a Rice parameter of {k}"));
    }
    at += 1;
    let mut bits = BitReader {
        bytes: &bytes[at..],
        at: 0,
    };
    let mut next = 0u32;
    let mut read_all = true;
    for _ in 0..n {
        let quotient = bits
            .unary(TERM_KEYS >> k)
            .ok_or("a key gap past the last key")?;
        let gap = (quotient << k) | bits.low(k);
        let key = next
            .checked_add(gap)
            .filter(|&key| key < TERM_KEYS)
            .ok_or("a key past the last key")?;
        next = key + 1;
        let frequency = match bits.ones_up_to(3) {
            ones @ 0..=2 => ones + 1,
            _ => {
                let f = bits.low(8);
                if f < 4 {
                    return Err(format!("a frequency of {f} written long"));
                }
                f
            }
        };
        if bits.overran() {
            return Err("the bits end early".into());
        }
        if !visit(key, frequency) {
            read_all = false;
            break;
        }
    }
    if read_all && bits.bytes.len() != bits.at.div_ceil(8) {
        return Err("bytes after the last entry".into());
    }
    Ok(length)
}

/// The Rice parameter for `n` keys spread over [`TERM_KEYS`]: about the
/// log of the mean gap.
fn rice_parameter(n: usize) -> u8 {
    let mean_gap = TERM_KEYS as usize / (n + 1);
    (usize::BITS - 1).saturating_sub(mean_gap.max(1).leading_zeros()) as u8
}

/// Writes bits most significant first, a whole byte at a time.
struct BitWriter {
    out: Vec<u8>,
    /// The bits not written yet, in the `used` low bits.
    pending: u64,
    /// Fewer than 8 between calls.
    used: u32,
}

impl BitWriter {
    /// The `count` (at most 32) low bits of `v`, most significant first.
    fn push_low(&mut self, v: u32, count: u32) {
        let mask = (1u64 << count) - 1;
        self.pending = (self.pending << count) | (u64::from(v) & mask);
        self.used += count;
        while self.used >= 8 {
            self.used -= 8;
            self.out.push((self.pending >> self.used) as u8);
        }
        self.pending &= (1u64 << self.used) - 1;
    }

    /// `count` one bits.
    fn push_ones(&mut self, mut count: u32) {
        while count > 0 {
            let n = count.min(32);
            self.push_low(u32::MAX, n);
            count -= n;
        }
    }

    fn finish(mut self) -> Vec<u8> {
        if self.used > 0 {
            self.out.push((self.pending << (8 - self.used)) as u8);
        }
        self.out
    }
}

struct BitReader<'a> {
    bytes: &'a [u8],
    /// Bits read. Past the end, bits read as zeros and [`overran`] says
    /// so.
    at: usize,
}

impl BitReader<'_> {
    /// The next 57 bits or more, first in the top bit.
    fn word(&self) -> u64 {
        let i = self.at / 8;
        let mut b = [0u8; 8];
        if let Some(rest) = self.bytes.get(i..) {
            let n = rest.len().min(8);
            b[..n].copy_from_slice(&rest[..n]);
        }
        u64::from_be_bytes(b) << (self.at % 8)
    }

    /// Ones up to the next zero (which is consumed); `None` past `max`
    /// ones.
    fn unary(&mut self, max: u32) -> Option<u32> {
        let mut count = 0u32;
        loop {
            let ones = (!self.word()).leading_zeros().min(57);
            count += ones;
            if count > max {
                return None;
            }
            if ones < 57 {
                self.at += ones as usize + 1;
                return Some(count);
            }
            self.at += 57;
            if self.overran() {
                return None;
            }
        }
    }

    /// Ones up to the next zero, at most `max` (below 57): the zero is
    /// consumed when it comes first.
    fn ones_up_to(&mut self, max: u32) -> u32 {
        let ones = (!self.word()).leading_zeros().min(max);
        self.at += ones as usize + usize::from(ones < max);
        ones
    }

    /// The next `count` bits (at most 32) as a number.
    fn low(&mut self, count: u32) -> u32 {
        if count == 0 {
            return 0;
        }
        let v = (self.word() >> (64 - count)) as u32;
        self.at += count as usize;
        v
    }

    /// Whether more bits were read than there are.
    fn overran(&self) -> bool {
        self.at > self.bytes.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: &TermVector) {
        let bytes = encode(v);
        assert_eq!(decode(&bytes).as_ref(), Ok(v), "{bytes:?}");
    }

    #[test]
    fn vectors_round_trip() {
        round_trip(&TermVector::default());
        round_trip(&TermVector::of("one"));
        round_trip(&TermVector::of(
            "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        ));
        round_trip(&TermVector::of(&"word ".repeat(300)));
        round_trip(&TermVector::of(
            "two two three three three four four four four",
        ));
        let text: String = (0..5_000).map(|n| format!("t{n} ")).collect();
        round_trip(&TermVector::of(&text));
        // The extremes of the key range.
        round_trip(&TermVector {
            length: u32::MAX,
            entries: vec![1, ((TERM_KEYS - 1) << 8) | 255],
        });
    }

    proptest::proptest! {
        #[test]
        fn any_vector_round_trips_and_answers_lookups(
            keys in proptest::collection::btree_map(0..TERM_KEYS, 1u32..=255, 0..400),
            length in proptest::prelude::any::<u32>(),
            probe in proptest::collection::vec(0..TERM_KEYS, 0..8),
        ) {
            let v = TermVector {
                length,
                entries: keys.iter().map(|(k, f)| (k << 8) | f).collect(),
            };
            let bytes = encode(&v);
            let decoded = decode(&bytes);
            proptest::prop_assert_eq!(decoded.as_ref(), Ok(&v));
            let want: Vec<u32> = probe.iter().map(|k| keys.get(k).copied().unwrap_or(0)).collect();
            for (k, w) in probe.iter().zip(&want) {
                let got = decoded.as_ref().map(|d| d.frequency(*k)).unwrap_or(0);
                proptest::prop_assert_eq!(got, *w);
            }
            proptest::prop_assert_eq!(frequencies(&bytes, &probe), Ok((length, want)));
        }
    }

    #[test]
    fn a_term_costs_about_two_bytes() {
        let text: String = (0..60).map(|n| format!("word{n} ")).collect();
        let v = TermVector::of(&text);
        let bytes = encode(&v).len();
        assert!(bytes <= 3 + 60 * 9 / 4, "{bytes} bytes for 60 terms");
    }

    #[test]
    fn damaged_bytes_are_refused_not_misread() {
        let v = TermVector::of("error in src/store/writer.rs, writer failed again");
        let bytes = encode(&v);
        assert!(decode(&[]).is_err());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        assert!(decode(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(decode(&[0, 1, 21]).is_err());
        // Every single-bit flip either fails or yields a well-formed vector.
        for i in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[i / 8] ^= 1 << (i % 8);
            if let Ok(d) = decode(&flipped) {
                assert!(d.is_well_formed(), "flip {i}: {d:?}");
            }
        }
    }
}
