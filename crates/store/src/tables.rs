//! The store's tables: the one place that names each table with its key
//! and value codecs ([`crate::codec`] holds the layouts).
//!
//! | table | key | value |
//! |---|---|---|
//! | `events` | serial (u64 BE) | header (id, pubkey, created_at, kind, expires_at) ‖ raw JSON |
//! | `ids` | id (32) | serial |
//! | `by_created` | created_at ‖ serial | empty |
//! | `by_author` | pubkey ‖ created_at ‖ serial | empty |
//! | `by_kind` | kind (u16 BE) ‖ created_at ‖ serial | empty |
//! | `by_author_kind` | pubkey ‖ kind ‖ created_at ‖ serial | empty |
//! | `by_tag` | letter ‖ encoded value ‖ created_at ‖ serial | empty |
//! | `addresses` | pubkey ‖ kind [‖ sha256(d)] | serial of the current version |
//! | `tombstones` | id ‖ deleter pubkey | empty |
//! | `address_tombstones` | pubkey ‖ kind [‖ sha256(d)] | newest deletion's created_at |
//! | `expiry` | expires_at ‖ serial | empty |
//! | `meta` | name (UTF-8) | u64 BE (`schema_version`, `next_serial`) |
//! | `policy` | `<list>:<item>` (UTF-8) | reason (UTF-8): the operator's runtime policy |
//! | `vanished` | pubkey (32) | created_at of its newest NIP-62 request to vanish |
//!
//! Every access goes through [`Table`], which turns bytes a codec cannot
//! read into `StoreError::Corrupt` naming the table: corrupt data is an
//! error to the caller, never a panic.

use std::convert::Infallible;
use std::ops::RangeBounds;

use heed::types::{Bytes, DecodeIgnore, Str, Unit};
use heed::{
    BytesDecode, BytesEncode, CommitOrAbort, CommitToken, Database, DatabaseOpener, Env, OnCommit,
    RoRange, RoRevRange, RoTxn, RwTxn, WithoutTls,
};
use sluice_proto::Event;

use crate::StoreError;
use crate::codec::{
    AddressCodec, AuthorKindPrefix, AuthorPrefix, EventCodec, IdCodec, IndexKeyCodec, KindPrefix,
    NoPrefix, TagPrefix, TombstoneCodec, U64Codec, hex_prefix, tag_prefix_into, time_serial_into,
};

/// How many tables [`Tables`] has: the environment must allow them.
pub(crate) const TABLE_COUNT: u32 = 14;

/// Keys of the `meta` table.
pub(crate) const META_VERSION: &str = "schema_version";
pub(crate) const META_NEXT_SERIAL: &str = "next_serial";
/// Prefix of the size horizons' keys (`retention_horizon:<scope>`).
pub(crate) const META_HORIZON_PREFIX: &str = "retention_horizon:";

/// An index table: `prefix ‖ created_at ‖ serial → ()`.
pub(crate) type IndexTable<'e, P> = Table<'e, IndexKeyCodec<P>, Unit>;

/// All tables of the store, typed. `'e` is `'static` once the transaction
/// that created them has committed.
#[derive(Clone, Copy)]
pub(crate) struct Tables<'e> {
    pub events: Table<'e, U64Codec, EventCodec>,
    pub ids: Table<'e, IdCodec, U64Codec>,
    pub by_created: IndexTable<'e, NoPrefix>,
    pub by_author: IndexTable<'e, AuthorPrefix>,
    pub by_kind: IndexTable<'e, KindPrefix>,
    pub by_author_kind: IndexTable<'e, AuthorKindPrefix>,
    pub by_tag: IndexTable<'e, TagPrefix>,
    pub addresses: Table<'e, AddressCodec, U64Codec>,
    pub tombstones: Table<'e, TombstoneCodec, Unit>,
    pub address_tombstones: Table<'e, AddressCodec, U64Codec>,
    pub expiry: IndexTable<'e, NoPrefix>,
    pub meta: Table<'e, Str, U64Codec>,
    pub policy: Table<'e, Str, Str>,
    pub vanished: Table<'e, IdCodec, U64Codec>,
}

/// The five time-ordered indexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Index {
    Created,
    Author,
    Kind,
    AuthorKind,
    Tag,
}

/// Every index entry of an event: the single source for insert and delete.
/// Each key is built in `buf` (cleared first, reused from key to key and
/// event to event: no allocation per key) and handed to `f`; the first
/// error stops the walk. The keys are [`crate::codec::index_key`] over
/// [`crate::codec::author_prefix`], [`crate::codec::kind_prefix`],
/// [`crate::codec::author_kind_prefix`] and [`crate::codec::tag_prefix`].
pub(crate) fn for_each_index_key<E>(
    ev: &Event,
    serial: u64,
    buf: &mut Vec<u8>,
    mut f: impl FnMut(Index, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let ca = ev.created_at;
    let kind = ev.kind.to_be_bytes();
    let fixed: [(Index, &[&[u8]]); 4] = [
        (Index::Created, &[]),
        (Index::Author, &[&ev.pubkey]),
        (Index::Kind, &[&kind]),
        (Index::AuthorKind, &[&ev.pubkey, &kind]),
    ];
    for (index, parts) in fixed {
        buf.clear();
        for part in parts {
            buf.extend_from_slice(part);
        }
        time_serial_into(buf, ca, serial);
        f(index, buf)?;
    }
    for (letter, value) in ev.indexed_tags() {
        buf.clear();
        tag_prefix_into(buf, letter, value);
        time_serial_into(buf, ca, serial);
        f(Index::Tag, buf)?;
    }
    Ok(())
}

impl Tables<'static> {
    /// Creates the tables that are missing and opens them all, in one
    /// committed transaction (opened, like every other, by
    /// [`crate::Store::begin_write`]).
    pub(crate) fn open(env: &Env<WithoutTls>) -> Result<Tables<'static>, heed::Error> {
        let wtxn = crate::Store::begin_write(env)?;
        let opened =
            env.create_databases_and_commit(wtxn, |wdo, wtxn| -> Result<_, heed::Error> {
                Ok(CommitOrAbort::<_, Infallible>::Commit(Tables {
                    events: Table::create(wdo, wtxn, "events")?,
                    ids: Table::create(wdo, wtxn, "ids")?,
                    by_created: Table::create(wdo, wtxn, "by_created")?,
                    by_author: Table::create(wdo, wtxn, "by_author")?,
                    by_kind: Table::create(wdo, wtxn, "by_kind")?,
                    by_author_kind: Table::create(wdo, wtxn, "by_author_kind")?,
                    by_tag: Table::create(wdo, wtxn, "by_tag")?,
                    addresses: Table::create(wdo, wtxn, "addresses")?,
                    tombstones: Table::create(wdo, wtxn, "tombstones")?,
                    address_tombstones: Table::create(wdo, wtxn, "address_tombstones")?,
                    expiry: Table::create(wdo, wtxn, "expiry")?,
                    meta: Table::create(wdo, wtxn, "meta")?,
                    policy: Table::create(wdo, wtxn, "policy")?,
                    vanished: Table::create(wdo, wtxn, "vanished")?,
                }))
            })?;
        match opened {
            CommitOrAbort::Commit(tables) => Ok(tables),
            CommitOrAbort::Abort(never) => match never {},
        }
    }
}

impl<'e> OnCommit for Tables<'e> {
    type Committed = Tables<'static>;

    fn on_commit(self, token: &CommitToken) -> Tables<'static> {
        Tables {
            events: self.events.on_commit(token),
            ids: self.ids.on_commit(token),
            by_created: self.by_created.on_commit(token),
            by_author: self.by_author.on_commit(token),
            by_kind: self.by_kind.on_commit(token),
            by_author_kind: self.by_author_kind.on_commit(token),
            by_tag: self.by_tag.on_commit(token),
            addresses: self.addresses.on_commit(token),
            tombstones: self.tombstones.on_commit(token),
            address_tombstones: self.address_tombstones.on_commit(token),
            expiry: self.expiry.on_commit(token),
            meta: self.meta.on_commit(token),
            policy: self.policy.on_commit(token),
            vanished: self.vanished.on_commit(token),
        }
    }
}

impl Tables<'_> {
    /// Every table's page counts.
    pub(crate) fn stats(&self, txn: &RoTxn) -> Result<Vec<heed::DatabaseStat>, StoreError> {
        Ok(vec![
            self.events.stat(txn)?,
            self.ids.stat(txn)?,
            self.by_created.stat(txn)?,
            self.by_author.stat(txn)?,
            self.by_kind.stat(txn)?,
            self.by_author_kind.stat(txn)?,
            self.by_tag.stat(txn)?,
            self.addresses.stat(txn)?,
            self.tombstones.stat(txn)?,
            self.address_tombstones.stat(txn)?,
            self.expiry.stat(txn)?,
            self.meta.stat(txn)?,
            self.policy.stat(txn)?,
            self.vanished.stat(txn)?,
        ])
    }

    /// [`Table::put_ascending`] for one of the indexes; `keys` sorted.
    pub(crate) fn index_put_ascending<'k>(
        &self,
        wtxn: &mut RwTxn<'_>,
        index: Index,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<(), StoreError> {
        let entries = keys.map(|k| (k, &()));
        match index {
            Index::Created => self.by_created.put_ascending(wtxn, entries),
            Index::Author => self.by_author.put_ascending(wtxn, entries),
            Index::Kind => self.by_kind.put_ascending(wtxn, entries),
            Index::AuthorKind => self.by_author_kind.put_ascending(wtxn, entries),
            Index::Tag => self.by_tag.put_ascending(wtxn, entries),
        }
    }

    /// Removes an entry from one of the indexes.
    pub(crate) fn index_delete(
        &self,
        wtxn: &mut RwTxn<'_>,
        index: Index,
        key: &[u8],
    ) -> Result<(), StoreError> {
        match index {
            Index::Created => self.by_created.delete(wtxn, key),
            Index::Author => self.by_author.delete(wtxn, key),
            Index::Kind => self.by_kind.delete(wtxn, key),
            Index::AuthorKind => self.by_author_kind.delete(wtxn, key),
            Index::Tag => self.by_tag.delete(wtxn, key),
        }
    }
}

/// One table: its LMDB database with the codecs of its key and value, and
/// its name for errors.
pub(crate) struct Table<'e, K, V> {
    name: &'static str,
    db: Database<'e, K, V>,
}

impl<K, V> Clone for Table<'_, K, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, V> Copy for Table<'_, K, V> {}

impl<'e, K: 'static, V: 'static> Table<'e, K, V> {
    /// Creates the table if it is missing and opens it.
    fn create(
        wdo: &DatabaseOpener<'e, WithoutTls>,
        wtxn: &mut RwTxn<'e>,
        name: &'static str,
    ) -> Result<Table<'e, K, V>, heed::Error> {
        Ok(Table {
            name,
            db: wdo.create_database(wtxn, Some(name))?,
        })
    }
}

impl<K, V> OnCommit for Table<'_, K, V> {
    type Committed = Table<'static, K, V>;

    fn on_commit(self, token: &CommitToken) -> Table<'static, K, V> {
        Table {
            name: self.name,
            db: self.db.on_commit(token),
        }
    }
}

impl<K, V> Table<'_, K, V> {
    pub(crate) fn get<'a, 't>(
        &self,
        txn: &'t RoTxn,
        key: &'a K::EItem,
    ) -> Result<Option<V::DItem>, StoreError>
    where
        K: BytesEncode<'a>,
        V: BytesDecode<'t>,
    {
        self.db.get(txn, key).map_err(|e| match e {
            heed::Error::Decoding(e) => StoreError::Corrupt {
                table: self.name,
                detail: match K::bytes_encode(key) {
                    Ok(k) => format!("{e} (key {})", hex_prefix(&k)),
                    Err(_) => e.to_string(),
                },
            },
            other => self.error(other),
        })
    }

    /// Whether the key is present; its value is not read (so it cannot be
    /// corrupt).
    pub(crate) fn contains<'a>(&self, txn: &RoTxn, key: &'a K::EItem) -> Result<bool, StoreError>
    where
        K: BytesEncode<'a>,
    {
        self.db
            .remap_data_type::<DecodeIgnore>()
            .get(txn, key)
            .map(|v| v.is_some())
            .map_err(|e| self.error(e))
    }

    pub(crate) fn put<'a>(
        &self,
        txn: &mut RwTxn<'_>,
        key: &'a K::EItem,
        value: &'a V::EItem,
    ) -> Result<(), StoreError>
    where
        K: BytesEncode<'a>,
        V: BytesEncode<'a>,
    {
        self.db.put(txn, key, value).map_err(|e| self.error(e))
    }

    /// Adds an entry whose key is greater than every key in the table
    /// (`MDB_APPEND`: no search from the root); an error, changing
    /// nothing, if it is not.
    pub(crate) fn append<'a>(
        &self,
        txn: &mut RwTxn<'_>,
        key: &'a K::EItem,
        value: &'a V::EItem,
    ) -> Result<(), StoreError>
    where
        K: BytesEncode<'a>,
        V: BytesEncode<'a>,
    {
        self.db
            .put_with_flags(txn, heed::PutFlags::APPEND, key, value)
            .map_err(|e| self.error(e))
    }

    /// Inserts entries given in ascending key order through one cursor. For
    /// each key LMDB first looks on the page the previous entry went to and
    /// searches from the root only when the key belongs elsewhere, so a
    /// sorted batch costs one descent per page it touches, not per entry.
    pub(crate) fn put_ascending<'a>(
        &self,
        txn: &mut RwTxn<'_>,
        entries: impl IntoIterator<Item = (&'a K::EItem, &'a V::EItem)>,
    ) -> Result<(), StoreError>
    where
        K: BytesEncode<'a> + 'a,
        V: BytesEncode<'a> + 'a,
    {
        let mut it = self.db.iter_mut(txn).map_err(|e| self.error(e))?;
        for (key, value) in entries {
            // SAFETY: neither `key` nor `value` borrows from this database
            // (they are the caller's owned bytes), and nothing read through
            // this cursor is held across the put. Without flags the put is
            // an ordinary insert-or-overwrite, positioned by key.
            unsafe { it.put_current_with_options::<V>(heed::PutFlags::empty(), key, value) }
                .map_err(|e| self.error(e))?;
        }
        Ok(())
    }

    /// Removes the entry if there is one.
    pub(crate) fn delete<'a>(
        &self,
        txn: &mut RwTxn<'_>,
        key: &'a K::EItem,
    ) -> Result<(), StoreError>
    where
        K: BytesEncode<'a>,
    {
        self.db
            .delete(txn, key)
            .map(drop)
            .map_err(|e| self.error(e))
    }

    pub(crate) fn range<'a, 't, R>(
        &self,
        txn: &'t RoTxn,
        range: &'a R,
    ) -> Result<RoRange<'t, K, V>, StoreError>
    where
        K: BytesEncode<'a>,
        R: RangeBounds<K::EItem>,
    {
        self.db.range(txn, range).map_err(|e| self.error(e))
    }

    pub(crate) fn rev_range<'a, 't, R>(
        &self,
        txn: &'t RoTxn,
        range: &'a R,
    ) -> Result<RoRevRange<'t, K, V>, StoreError>
    where
        K: BytesEncode<'a>,
        R: RangeBounds<K::EItem>,
    {
        self.db.rev_range(txn, range).map_err(|e| self.error(e))
    }

    /// The first key of `range`, as stored bytes.
    pub(crate) fn first_key_bytes<'a, 't, R>(
        &self,
        txn: &'t RoTxn,
        range: &'a R,
    ) -> Result<Option<&'t [u8]>, StoreError>
    where
        K: BytesEncode<'a>,
        R: RangeBounds<K::EItem>,
    {
        let mut it = self
            .db
            .remap_data_type::<DecodeIgnore>()
            .range(txn, range)
            .map_err(|e| self.error(e))?
            .remap_key_type::<Bytes>();
        match it.next() {
            None => Ok(None),
            Some(item) => item.map(|(k, ())| Some(k)).map_err(|e| self.error(e)),
        }
    }

    /// Page counts of the table's B-tree.
    pub(crate) fn stat(&self, txn: &RoTxn) -> Result<heed::DatabaseStat, StoreError> {
        self.db.stat(txn).map_err(|e| self.error(e))
    }

    pub(crate) fn len(&self, txn: &RoTxn) -> Result<u64, StoreError> {
        self.db.len(txn).map_err(|e| self.error(e))
    }

    /// Names this table in an error; bytes its codecs cannot read are
    /// `Corrupt`. Iterators' items are mapped with this.
    pub(crate) fn error(&self, e: heed::Error) -> StoreError {
        match e {
            heed::Error::Decoding(e) => StoreError::Corrupt {
                table: self.name,
                detail: e.to_string(),
            },
            other => StoreError::Lmdb(other),
        }
    }
}
