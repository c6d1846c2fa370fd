//! Address blocks, the one type every list of addresses is made of:
//! `throttle.clients.trusted_proxies`, `metrics.allow_from`,
//! `policy.deny_ips` and NIP-86 `blockip`.
//!
//! Invariant: a block and an address compare in one family. An IPv4 client
//! reaching a dual-stack listener (`[::]:…`) has the peer address
//! `::ffff:a.b.c.d` (IPv4-mapped IPv6); the server makes every address
//! canonical once, where it takes it (the peer's at accept, the ones a
//! trusted proxy reports in its headers), with [`IpAddr::to_canonical`],
//! and [`IpBlock::parse`] does the same to a block written in mapped form.
//! So an IPv4 client is in the IPv4 blocks, however it connected, and
//! [`IpBlock::contains`] needs no mapping of its own.

use std::fmt;
use std::net::IpAddr;

/// An address block: an address with a prefix length (`10.0.0.0/8`,
/// `2001:db8::/32`), or one address (`127.0.0.1`, the whole length).
///
/// A block written in IPv4-mapped form is the IPv4 block it maps:
/// `::ffff:10.0.0.0/104` is `10.0.0.0/8` and `::ffff:10.0.0.1` is
/// `10.0.0.1` (a prefix of 96 + n bits is the IPv4 prefix of n bits). One
/// with a prefix under 96 bits (`::ffff:10.0.0.0/80`) would mix mapped and
/// plain IPv6 addresses and is refused ([`BlockError::MappedPrefix`]).
/// An IPv6 block holds no IPv4 client, even one spanning the mapped range
/// (`::/0` is every IPv6 address, not every address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpBlock {
    addr: IpAddr,
    bits: u8,
}

/// Why a string is not an [`IpBlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// Not an IPv4 or IPv6 address, optionally followed by `/` and a
    /// prefix length no longer than the address.
    #[error("not an address or CIDR block")]
    Syntax,
    /// An IPv4-mapped block (`::ffff:a.b.c.d/n`) with `n` under 96.
    #[error(
        "an IPv4-mapped block needs a prefix of at least /96 (::ffff:a.b.c.d/96+n is the IPv4 block a.b.c.d/n): write the IPv4 block"
    )]
    MappedPrefix,
}

impl IpBlock {
    /// An IPv4 or IPv6 address, optionally followed by `/` and a prefix
    /// length no longer than the address; spaces around either part are
    /// ignored. A mapped block becomes its IPv4 block (see [`IpBlock`]).
    pub fn parse(s: &str) -> Result<IpBlock, BlockError> {
        let (addr, bits) = match s.trim().split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| BlockError::Syntax)?;
        let max = max_bits(addr);
        let bits = match bits {
            Some(b) => b.trim().parse::<u8>().map_err(|_| BlockError::Syntax)?,
            None => max,
        };
        if bits > max {
            return Err(BlockError::Syntax);
        }
        match addr {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) if bits >= 96 => Ok(IpBlock {
                    addr: IpAddr::V4(v4),
                    bits: bits - 96,
                }),
                Some(_) => Err(BlockError::MappedPrefix),
                None => Ok(IpBlock { addr, bits }),
            },
            IpAddr::V4(_) => Ok(IpBlock { addr, bits }),
        }
    }

    /// True when `ip` is in the block. `ip` is canonical (see the module
    /// docs): an IPv4 address is never in an IPv6 block, nor the reverse,
    /// and `::ffff:10.0.0.1` as such is in no IPv4 block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }

    /// The address as written (host bits are kept: `10.1.2.3/8`), IPv4
    /// for a block written in mapped form.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length, in bits of [`IpBlock::addr`]'s family.
    pub fn prefix_len(&self) -> u8 {
        self.bits
    }
}

fn max_bits(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// The address alone for a whole-length block (`1.2.3.4`), else
/// `address/length`; a mapped block shows as its IPv4 block.
impl fmt::Display for IpBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bits == max_bits(self.addr) {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.bits)
        }
    }
}

#[cfg(test)]
mod tests;
