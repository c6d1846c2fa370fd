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
//!
//! Every address is canonical (`IpAddr::to_canonical`: an IPv4-mapped IPv6
//! address is its IPv4 one), so it compares with the blocks
//! ([`IpBlock`]) in one family: the peer's, made so once at accept
//! (`crates/server/src/accept.rs`), and those read from the headers, made so
//! here.

use std::net::IpAddr;

use axum::http::HeaderMap;
use sluice_throttle::{BlockError, IpBlock};

/// The peers whose forwarding headers are believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpBlock>);

impl TrustedProxies {
    /// Parses `throttle.clients.trusted_proxies`; the error names the key
    /// and the entry that is not an address or CIDR block (or a mapped
    /// block under /96, and why).
    pub fn parse(list: &[String]) -> Result<TrustedProxies, String> {
        list.iter()
            .map(|p| {
                IpBlock::parse(p).map_err(|e| match e {
                    BlockError::Syntax => format!(
                        "throttle.clients.trusted_proxies: {p:?} is not an address or CIDR block"
                    ),
                    e => format!("throttle.clients.trusted_proxies: {p:?}: {e}"),
                })
            })
            .collect::<Result<_, _>>()
            .map(TrustedProxies)
    }

    /// True when `ip` (canonical) is in one of the blocks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client's address: the peer's (canonical, as accept made it), or
    /// when the peer is trusted, the last untrusted hop of X-Forwarded-For,
    /// else X-Real-IP, made canonical (a proxy on a dual-stack listener
    /// writes an IPv4 hop as `::ffff:a.b.c.d`).
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
                .filter_map(|h| h.trim().parse::<IpAddr>().ok().map(|ip| ip.to_canonical()))
                .collect();
            if let Some(ip) = hops.iter().rev().find(|ip| !self.contains(**ip)) {
                return *ip;
            }
        }
        real_ip
            .and_then(|r| r.trim().parse::<IpAddr>().ok().map(|ip| ip.to_canonical()))
            .unwrap_or(peer)
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
    fn a_bad_entry_is_named_with_the_key() {
        let list = vec!["127.0.0.1".to_string(), "10.0.0.0/40".to_string()];
        let err = TrustedProxies::parse(&list).unwrap_err();
        assert_eq!(
            err,
            "throttle.clients.trusted_proxies: \"10.0.0.0/40\" is not an address or CIDR block"
        );
        assert_eq!(TrustedProxies::parse(&[]), Ok(TrustedProxies::default()));
        let mapped = TrustedProxies::parse(&["::ffff:10.0.0.0/80".to_string()]).unwrap_err();
        assert!(
            mapped.starts_with("throttle.clients.trusted_proxies: \"::ffff:10.0.0.0/80\": ")
                && mapped.contains("write the IPv4 block"),
            "{mapped}"
        );
    }

    #[test]
    fn addresses_from_the_headers_are_made_canonical() {
        let t = TrustedProxies::parse(&["127.0.0.0/8".to_string()]).unwrap();
        let proxy = ip("127.0.0.1");
        // An inner proxy on a dual-stack listener writes its peer mapped:
        // still a trusted hop, skipped.
        assert_eq!(
            t.client_ip(proxy, Some("198.51.100.7, ::ffff:127.0.0.2"), None),
            ip("198.51.100.7")
        );
        assert_eq!(
            t.client_ip(proxy, Some("::ffff:198.51.100.7"), None),
            ip("198.51.100.7")
        );
        assert_eq!(
            t.client_ip(proxy, None, Some("::ffff:198.51.100.8")),
            ip("198.51.100.8")
        );
        assert_eq!(
            t.client_ip(proxy, Some("2001:db8::7"), None),
            ip("2001:db8::7")
        );
        // A mapped block written by the operator is its IPv4 block.
        let m = TrustedProxies::parse(&["::ffff:127.0.0.0/104".to_string()]).unwrap();
        assert_eq!(m, t);
        assert_eq!(
            m.client_ip(proxy, Some("198.51.100.7"), None),
            ip("198.51.100.7")
        );
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
