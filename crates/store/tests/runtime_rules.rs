//! The runtime policy table survives reopening; a purge removes only the
//! author's events, with their index entries.

use sluice_proto::Event;

use sluice_store::{Store, StoreOptions};

#[test]
fn entries_survive_reopening_and_a_purge_removes_only_that_author() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    store.set_policy("ban_pubkey:aa", Some("spam")).unwrap();
    store.set_policy("allow_kind:1", Some("")).unwrap();
    store.set_policy("allow_kind:1", None).unwrap();
    let a: Vec<Event> = (0..5)
        .map(|i| Event::sign(&[1; 32], 100 + i, 1, vec![], "a"))
        .collect();
    let b = Event::sign(&[2; 32], 100, 1, vec![], "b");
    store.write_batch(a.iter().chain([&b]), 1000).unwrap();
    assert_eq!(store.purge_author(&a[0].pubkey, 3).unwrap(), 3);
    assert_eq!(store.purge_author(&a[0].pubkey, 3).unwrap(), 2);
    assert_eq!(store.purge_author(&a[0].pubkey, 3).unwrap(), 0);
    assert!(store.get(&b.id, 1000).unwrap().is_some());
    assert!(store.get(&a[4].id, 1000).unwrap().is_none());
    assert!(store.purge_event(&b.id).unwrap());
    assert!(!store.purge_event(&b.id).unwrap());
    store.close();
    let store = Store::open(dir.path(), &StoreOptions::default()).unwrap();
    assert_eq!(
        store.policy_entries().unwrap(),
        vec![("ban_pubkey:aa".to_string(), "spam".to_string())]
    );
    assert_eq!(store.stats().unwrap().events, 0);
}
