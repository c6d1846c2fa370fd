//! The client's address, which every per-client limit keys on: the TCP
//! peer's, or, when the peer is a trusted proxy
//! (`throttle.clients.trusted_proxies`), the address the proxy reports in
//! X-Forwarded-For or X-Real-IP.
//!
//! Invariants: a header is believed only from a trusted peer; of
//! X-Forwarded-For the last hop that is not itself a trusted proxy is the
//! client (the hops left of it were written by the client and may be
//! forged); a header that does not parse never fails a connection, the
//! peer's address counts instead. The list is part of the `[throttle]`
//! section the engine holds, and is read from there at each connection, so
//! a SIGHUP reload applies from the next connection on.

use std::net::IpAddr;

use axum::http::HeaderMap;

/// An address block: an address with a prefix length (`10.0.0.0/8`), or
/// one address (`127.0.0.1`, the whole length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `None` unless `s` is an IPv4 or IPv6 address, optionally followed
    /// by `/` and a prefix length no longer than the address.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a.parse::<IpAddr>().ok()?, Some(b.parse::<u8>().ok()?)),
            None => (s.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        (bits <= max).then_some(Cidr { net: addr, bits })
    }

    /// True when `ip` is in the block (an IPv4 address is never in an
    /// IPv6 block, nor the reverse).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.bits as u32).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.bits as u32).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The peers whose forwarding headers are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// Parses `throttle.clients.trusted_proxies`; the error names the key
    /// and the entry that is not an address or CIDR block.
    pub fn parse(list: &[String]) -> Result<TrustedProxies, String> {
        list.iter()
            .map(|p| {
                Cidr::parse(p).ok_or_else(|| {
                    format!(
                        "throttle.clients.trusted_proxies: {p:?} is not an address or CIDR block"
                    )
                })
            })
            .collect::<Result<_, _>>()
            .map(TrustedProxies)
    }

    /// True when `ip` is in one of the blocks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client's address: the peer's, or when the peer is trusted, the
    /// last untrusted hop of X-Forwarded-For, else X-Real-IP.
    pub fn client_ip(
        &self,
        peer: IpAddr,
        forwarded_for: Option<&str>,
        real_ip: Option<&str>,
    ) -> IpAddr {
        if !self.contains(peer) {
            return peer;
        }
        if let Some(xff) = forwarded_for {
            let hops: Vec<IpAddr> = xff
                .split(',')
                .filter_map(|h| h.trim().parse().ok())
                .collect();
            if let Some(ip) = hops.iter().rev().find(|ip| !self.contains(**ip)) {
                return *ip;
            }
        }
        real_ip.and_then(|r| r.trim().parse().ok()).unwrap_or(peer)
    }

    /// [`TrustedProxies::client_ip`] of a request's headers.
    pub fn client_ip_of(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        self.client_ip(peer, header("x-forwarded-for"), header("x-real-ip"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_blocks() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(ip("10.1.2.3")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert!(!c.contains(ip("::ffff:10.1.2.3")));
        assert!(Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.1")));
        assert!(!Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.2")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("192.0.2.1")));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "localhost",
            "",
            "10.0.0.0/8/8",
        ] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_bad_entry_is_named_with_the_key() {
        let list = vec!["127.0.0.1".to_string(), "10.0.0.0/40".to_string()];
        let err = TrustedProxies::parse(&list).unwrap_err();
        assert_eq!(
            err,
            "throttle.clients.trusted_proxies: \"10.0.0.0/40\" is not an address or CIDR block"
        );
        assert_eq!(TrustedProxies::parse(&[]), Ok(TrustedProxies::default()));
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let t = TrustedProxies::parse(&["127.0.0.1/32".to_string()]).unwrap();
        let proxy = ip("127.0.0.1");
        let other = ip("192.0.2.9");
        assert_eq!(
            t.client_ip(proxy, Some("198.51.100.7, 127.0.0.1"), None),
            ip("198.51.100.7")
        );
        assert_eq!(
            t.client_ip(proxy, Some("203.0.113.1, 198.51.100.7"), None),
            ip("198.51.100.7"),
            "the last untrusted hop, not a forgeable earlier one"
        );
        assert_eq!(
            t.client_ip(proxy, None, Some(" 198.51.100.8 ")),
            ip("198.51.100.8")
        );
        assert_eq!(t.client_ip(proxy, Some("junk"), Some("junk")), proxy);
        assert_eq!(t.client_ip(other, Some("198.51.100.7"), None), other);
        assert_eq!(
            TrustedProxies::default().client_ip(proxy, Some("198.51.100.7"), None),
            proxy
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", "198.51.100.7".parse().unwrap());
        assert_eq!(t.client_ip_of(proxy, &headers), ip("198.51.100.7"));
        assert_eq!(t.client_ip_of(other, &headers), other);
    }
}
