//! Sets of IPv4 addresses as sorted disjoint half-open intervals, and their
//! prefixes (what an LPM trie holds).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// A set of addresses: sorted, disjoint, non-adjacent `[start, end)`
/// intervals over `0..2^32`, each labelled with a number (the policy that
/// brought it; the first one when several overlap).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddrSet {
    spans: Vec<(u64, u64, u32)>,
}

impl AddrSet {
    /// Every address.
    pub fn all(label: u32) -> Self {
        Self {
            spans: vec![(0, 1 << 32, label)],
        }
    }

    /// The addresses of `net`.
    pub fn net(net: Ipv4Net, label: u32) -> Self {
        let start = u64::from(u32::from(net.network()));
        let size = 1u64 << (32 - net.prefix_len());
        Self {
            spans: vec![(start, start + size, label)],
        }
    }

    /// One address.
    pub fn addr(a: Ipv4Addr, label: u32) -> Self {
        let s = u64::from(u32::from(a));
        Self {
            spans: vec![(s, s + 1, label)],
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Whether `a` is in the set.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        let a = u64::from(u32::from(a));
        self.spans.iter().any(|&(s, e, _)| s <= a && a < e)
    }

    /// The union of many sets; where they overlap, the label of the span
    /// that starts first (then the smaller label).
    pub fn union<'a>(sets: impl IntoIterator<Item = &'a AddrSet>) -> Self {
        let mut all: Vec<(u64, u64, u32)> = sets
            .into_iter()
            .flat_map(|s| s.spans.iter().copied())
            .collect();
        all.sort_unstable();
        let mut spans: Vec<(u64, u64, u32)> = Vec::with_capacity(all.len());
        for (s, e, l) in all {
            match spans.last_mut() {
                Some(last) if s <= last.1 => {
                    if e > last.1 {
                        if last.2 == l {
                            last.1 = e;
                        } else {
                            let from = last.1;
                            spans.push((from, e, l));
                        }
                    }
                }
                _ => spans.push((s, e, l)),
            }
        }
        Self { spans }
    }

    /// The set without the addresses of `other`.
    pub fn minus(&self, other: &AddrSet) -> Self {
        let mut out = Vec::new();
        for &(mut s, e, l) in &self.spans {
            for &(os, oe, _) in &other.spans {
                if oe <= s || os >= e {
                    continue;
                }
                if os > s {
                    out.push((s, os, l));
                }
                s = s.max(oe);
                if s >= e {
                    break;
                }
            }
            if s < e {
                out.push((s, e, l));
            }
        }
        Self { spans: out }
    }

    /// The set as disjoint prefixes (network, length, label), the fewest
    /// that cover exactly the set.
    pub fn prefixes(&self) -> Vec<(Ipv4Addr, u8, u32)> {
        let mut out = Vec::with_capacity(self.spans.len());
        for &(s, e, l) in &self.spans {
            for (start, bits) in aligned_blocks(s, e, 32) {
                out.push((Ipv4Addr::from(start as u32), bits, l));
            }
        }
        out
    }
}

/// The aligned blocks covering `[s, e)` in a space of `width` bits: (first
/// value, significant bits), in order (an iterator: a trie's 10,000
/// prefixes are listed without a list per span).
pub fn aligned_blocks(s: u64, e: u64, width: u32) -> impl Iterator<Item = (u64, u8)> {
    let mut s = s;
    std::iter::from_fn(move || {
        if s >= e {
            return None;
        }
        let mut size: u64 = if s == 0 {
            1 << width
        } else {
            1 << s.trailing_zeros().min(width)
        };
        while s + size > e {
            size >>= 1;
        }
        let block = (s, (width - size.trailing_zeros()) as u8);
        s += size;
        Some(block)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("net")
    }

    #[test]
    fn blocks_cover_exactly() {
        let blocks = |s, e, w| aligned_blocks(s, e, w).collect::<Vec<_>>();
        assert_eq!(blocks(0, 1 << 16, 16), vec![(0, 0)]);
        assert_eq!(blocks(80, 81, 16), vec![(80, 16)]);
        // 32000..=32768: 32000/8 … 32768/16.
        let b = blocks(32000, 32769, 16);
        let covered: u64 = b.iter().map(|&(_, bits)| 1u64 << (16 - bits)).sum();
        assert_eq!(covered, 769);
        assert_eq!(b.last(), Some(&(32768, 16)));
    }

    #[test]
    fn except_cuts_a_hole() {
        let s = AddrSet::net(net("10.0.0.0/8"), 1).minus(&AddrSet::net(net("10.1.0.0/16"), 0));
        assert!(s.contains("10.0.255.255".parse().expect("a")));
        assert!(!s.contains("10.1.2.3".parse().expect("a")));
        assert!(s.contains("10.2.0.0".parse().expect("a")));
        let p = s.prefixes();
        assert!(p.iter().all(|&(_, _, l)| l == 1));
        assert!(
            !p.iter()
                .any(|&(a, b, _)| a == "10.1.0.0".parse::<Ipv4Addr>().expect("a") && b == 16)
        );
    }

    #[test]
    fn union_merges_and_keeps_first_label() {
        let u = AddrSet::union(&[
            AddrSet::net(net("10.0.0.0/24"), 2),
            AddrSet::net(net("10.0.0.128/25"), 3),
            AddrSet::net(net("10.0.1.0/24"), 2),
        ]);
        assert_eq!(u.prefixes(), vec![("10.0.0.0".parse().expect("a"), 23, 2)]);
        assert_eq!(
            AddrSet::all(1).prefixes(),
            vec![(Ipv4Addr::UNSPECIFIED, 0, 1)]
        );
    }
}
