use super::*;

fn cfg() -> TiersConfig {
    TiersConfig {
        authenticated: TierShare {
            weight: 2,
            rate_multiplier: 1.5,
        },
        listed: vec![
            ListedTier {
                name: "paid".into(),
                weight: 4,
                rate_multiplier: 5.0,
                pubkeys: vec!["11".repeat(32), "22".repeat(32)],
            },
            ListedTier {
                name: "trusted".into(),
                weight: 8,
                rate_multiplier: 10.0,
                pubkeys: vec!["22".repeat(32)],
            },
        ],
    }
}

#[test]
fn the_highest_tier_among_the_authenticated_pubkeys_wins() {
    let tiers = Tiers::new(&cfg());
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let anon = tiers.principal(ip, &[]);
    assert_eq!(anon.tier.name, "anonymous");
    assert_eq!(anon.key, ClientKey::Ip(ip));
    let unlisted = tiers.principal(ip, &[[9; 32]]);
    assert_eq!(unlisted.tier.name, "authenticated");
    assert!(unlisted.tier.charges_address);
    assert_eq!(unlisted.key, ClientKey::Pubkey([9; 32]));
    let paid = tiers.principal(ip, &[[9; 32], [0x11; 32]]);
    assert_eq!((paid.tier.name, paid.tier.weight), ("paid", 4));
    assert_eq!(paid.key, ClientKey::Pubkey([0x11; 32]));
    assert!(!paid.tier.charges_address);
    // In two tiers: the heavier.
    let both = tiers.principal(ip, &[[0x22; 32]]);
    assert_eq!(both.tier.name, "trusted");
    let order = tiers.principal(ip, &[[0x22; 32], [0x11; 32]]);
    assert_eq!(order.tier.name, "trusted", "order does not matter");
}

#[test]
fn bad_tiers_are_named() {
    let mut c = cfg();
    c.listed[0].weight = 0;
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("listed[0].weight")
    );
    let mut c = cfg();
    c.listed[1].name = "Trusted!".into();
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("listed[1].name")
    );
    let mut c = cfg();
    c.listed[1].pubkeys.push("zz".into());
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("listed[1].pubkeys")
    );
    let mut c = cfg();
    c.authenticated.rate_multiplier = 0.0;
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("authenticated.rate_multiplier")
    );
    assert!(cfg().validate().is_ok());
}

#[test]
fn a_listed_tier_without_weight_or_multiplier_gets_one_of_each() {
    let t: ListedTier = serde_json::from_str(r#"{"name":"paid"}"#).unwrap();
    assert_eq!(t.weight, 1);
    assert_eq!(t.rate_multiplier, 1.0);
    assert!(t.pubkeys.is_empty());
}

#[test]
fn fourteen_listed_tiers_are_taken_and_fifteen_refused() {
    let tier = |i: usize| ListedTier {
        name: format!("t{i}"),
        weight: 1,
        rate_multiplier: 1.0,
        pubkeys: Vec::new(),
    };
    let mut c = TiersConfig {
        listed: (0..MAX_LISTED_TIERS).map(tier).collect(),
        ..TiersConfig::default()
    };
    c.validate().unwrap();
    assert_eq!(Tiers::new(&c).all().len(), MAX_LISTED_TIERS + 2);
    c.listed.push(tier(MAX_LISTED_TIERS));
    assert_eq!(c.validate().unwrap_err().key, "listed");
}

#[test]
fn a_listed_tier_may_not_take_a_built_in_name() {
    for name in ["anonymous", "authenticated"] {
        let mut c = cfg();
        c.listed[0].name = name.into();
        assert_eq!(c.validate().unwrap_err().key, "listed[0].name", "{name}");
    }
}

#[test]
fn every_tier_is_listed_by_index() {
    let tiers = Tiers::new(&cfg());
    let names: Vec<(u8, &str)> = tiers.all().iter().map(|t| (t.index, t.name)).collect();
    assert_eq!(
        names,
        [
            (0, "anonymous"),
            (1, "authenticated"),
            (2, "paid"),
            (3, "trusted")
        ]
    );
}

#[test]
fn a_tier_from_the_web_of_trust_must_name_a_tier_above_anonymous() {
    let tiers = Tiers::new(&cfg());
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let by = |index: u8| tiers.principal_with(ip, &[[9; 32]], move |_| Some(index));
    assert_eq!(by(3).tier.name, "trusted");
    assert_eq!(by(2).tier.name, "paid");
    assert_eq!(by(1).tier.name, "authenticated");
    // Out of range, or anonymous: authenticated.
    assert_eq!(by(4).tier.name, "authenticated");
    assert_eq!(by(200).tier.name, "authenticated");
    assert_eq!(by(0).tier.name, "authenticated");
    // A listed tier wins over the web's.
    let listed = tiers.principal_with(ip, &[[0x11; 32]], |_| Some(3));
    assert_eq!(listed.tier.name, "paid");
}

#[test]
fn between_tiers_of_equal_weight_the_first_pubkey_is_kept() {
    let tiers = Tiers::new(&cfg());
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let p = tiers.principal(ip, &[[8; 32], [9; 32]]);
    assert_eq!(p.key, ClientKey::Pubkey([8; 32]));
    let p = tiers.principal(ip, &[[9; 32], [8; 32]]);
    assert_eq!(p.key, ClientKey::Pubkey([9; 32]));
    // A heavier tier later in the list takes over.
    let p = tiers.principal(ip, &[[9; 32], [0x11; 32], [8; 32]]);
    assert_eq!(p.key, ClientKey::Pubkey([0x11; 32]));
}
