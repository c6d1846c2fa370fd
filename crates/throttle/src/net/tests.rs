use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn block(s: &str) -> IpBlock {
    IpBlock::parse(s).unwrap()
}

#[test]
fn ipv4_blocks_hold_their_prefix() {
    let b = block("10.0.0.0/8");
    assert!(b.contains(ip("10.1.2.3")));
    assert!(!b.contains(ip("11.0.0.1")));
    assert!(block("127.0.0.1").contains(ip("127.0.0.1")));
    assert!(!block("127.0.0.1").contains(ip("127.0.0.2")));
    assert!(block("0.0.0.0/0").contains(ip("192.0.2.1")));
    assert!(block("10.1.0.0/16").contains(ip("10.1.200.3")));
    assert!(!block("10.1.0.0/16").contains(ip("10.2.0.1")));
    assert!(block(" 10.0.0.0 / 8 ").contains(ip("10.9.9.9")));
}

#[test]
fn ipv6_blocks_hold_their_prefix_and_no_ipv4_address() {
    let b = block("2001:db8::/32");
    assert!(b.contains(ip("2001:db8:ffff::1")));
    assert!(!b.contains(ip("2001:db9::1")));
    assert!(block("::1").contains(ip("::1")));
    assert!(!block("::1").contains(ip("127.0.0.1")));
    // Every IPv6 address, not every address.
    assert!(block("::/0").contains(ip("2001:db8::1")));
    assert!(!block("::/0").contains(ip("10.0.0.1")));
    assert!(!block("10.0.0.0/8").contains(ip("2001:db8::1")));
}

#[test]
fn a_mapped_address_made_canonical_is_in_its_ipv4_block() {
    let b = block("10.0.0.0/8");
    let mapped = ip("::ffff:10.1.2.3");
    assert!(b.contains(mapped.to_canonical()));
    assert!(!block("10.0.0.0/8").contains(ip("::ffff:11.0.0.1").to_canonical()));
    // One family: canonical addresses are the caller's contract.
    assert!(!b.contains(mapped));
}

#[test]
fn a_mapped_block_is_its_ipv4_block() {
    assert_eq!(block("::ffff:10.0.0.0/104"), block("10.0.0.0/8"));
    assert_eq!(block("::ffff:10.0.0.0/104").to_string(), "10.0.0.0/8");
    assert_eq!(block("::ffff:10.0.0.1"), block("10.0.0.1"));
    assert_eq!(block("::ffff:a00:1/128").to_string(), "10.0.0.1");
    assert_eq!(block("::ffff:0:0/96"), block("0.0.0.0/0"));
    assert!(block("::ffff:127.0.0.0/104").contains(ip("127.0.0.1")));
    for short in ["::ffff:10.0.0.0/80", "::ffff:0:0/95", "::ffff:10.0.0.0/0"] {
        assert_eq!(
            IpBlock::parse(short),
            Err(BlockError::MappedPrefix),
            "{short}"
        );
    }
    // Not mapped: an IPv6 block like any other.
    assert_eq!(block("::fffe:0:0/94").to_string(), "::fffe:0:0/94");
    assert!(
        BlockError::MappedPrefix
            .to_string()
            .contains("write the IPv4 block")
    );
}

#[test]
fn bad_prefixes_and_addresses_are_refused() {
    for bad in [
        "10.0.0.0/33",
        "10.0.0.1/33",
        "::/129",
        "10.0.0.0/",
        "10.0.0.0/-1",
        "10.0.0.0/x",
        "10.0.0.0/8/8",
        "/8",
        "localhost",
        "10.0.0",
        "",
    ] {
        assert_eq!(IpBlock::parse(bad), Err(BlockError::Syntax), "{bad}");
    }
    assert_eq!(
        BlockError::Syntax.to_string(),
        "not an address or CIDR block"
    );
}

#[test]
fn display_is_the_address_alone_or_with_its_length() {
    assert_eq!(block("1.2.3.4").to_string(), "1.2.3.4");
    assert_eq!(block("1.2.3.4/32").to_string(), "1.2.3.4");
    assert_eq!(block("10.1.2.3/8").to_string(), "10.1.2.3/8");
    assert_eq!(block("2001:DB8::/32").to_string(), "2001:db8::/32");
    assert_eq!(block("::1/128").to_string(), "::1");
    let b = block("::ffff:10.0.0.0/104");
    assert_eq!((b.addr(), b.prefix_len()), (ip("10.0.0.0"), 8));
}
