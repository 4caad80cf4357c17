//! A bounded cache of the ids of text pieces, one per thread, for
//! [`super::piece_encoding::PieceEncoder`].
//!
//! Each thread that encodes (a rayon worker, mostly) keeps its own cache, so that looking a word
//! up takes no lock. A cache belongs to one encoder at a time (its `owner` number): a thread that
//! encodes for another encoder starts its cache over. A full cache starts over too: under a
//! Zipf law the frequent words are back after a few documents, and nothing is evicted one by
//! one.
//!
//! The table is a plain open-addressing one (linear probing, at most half full) over two arenas,
//! the pieces' bytes and their ids, with simple loops: the workspace's own crates are built
//! without optimisation in the `dev` profile the project runs (see the workspace `Cargo.toml`),
//! where a generic hash map's layers of small functions cost several times what they do
//! optimised, and this lookup runs once per word of the corpus.

use std::cell::RefCell;

/// The most pieces one thread's cache holds; the next one empties it.
pub const CACHED_PIECES: usize = 1 << 16;
/// The longest piece, in bytes, that is cached: longer ones are rarely seen twice.
pub const MAX_CACHED_PIECE_BYTES: usize = 64;

/// Slots of the table: twice the pieces, so that probes stay short.
const SLOTS: usize = 2 * CACHED_PIECES;

/// One slot: a piece's hash, where its bytes and ids are in the arenas; `key_len` 0 when empty
/// (cached pieces are never empty).
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    hash: u64,
    key_start: u32,
    key_len: u32,
    ids_start: u32,
    ids_len: u32,
}

/// A thread's cache: the ids of the pieces one encoder has met.
#[derive(Debug, Default)]
pub struct PieceCache {
    owner: u64,
    /// Empty until the first piece is cached, then [`SLOTS`] long.
    slots: Vec<Slot>,
    keys: Vec<u8>,
    ids: Vec<u32>,
    len: usize,
}

impl PieceCache {
    /// The ids of `piece`, whose [`piece_hash`] is `hash`, if cached.
    pub fn get(&self, hash: u64, piece: &[u8]) -> Option<&[u32]> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = SLOTS - 1;
        let mut index = hash as usize & mask;
        loop {
            let slot = self.slots[index];
            if slot.key_len == 0 {
                return None;
            }
            if slot.hash == hash {
                let start = slot.key_start as usize;
                if &self.keys[start..start + slot.key_len as usize] == piece {
                    let start = slot.ids_start as usize;
                    return Some(&self.ids[start..start + slot.ids_len as usize]);
                }
            }
            index = (index + 1) & mask;
        }
    }

    /// Remembers the ids of `piece` (whose [`piece_hash`] is `hash`), which must not be cached
    /// yet; pieces longer than [`MAX_CACHED_PIECE_BYTES`] and empty ones are not. Empties the
    /// cache first when it is full.
    pub fn insert(&mut self, hash: u64, piece: &[u8], ids: &[u32]) {
        if piece.is_empty() || piece.len() > MAX_CACHED_PIECE_BYTES {
            return;
        }
        if self.len >= CACHED_PIECES {
            self.clear();
        }
        if self.slots.is_empty() {
            self.slots = vec![Slot::default(); SLOTS];
        }
        let mask = SLOTS - 1;
        let mut index = hash as usize & mask;
        while self.slots[index].key_len != 0 {
            index = (index + 1) & mask;
        }
        self.slots[index] = Slot {
            hash,
            key_start: self.keys.len() as u32,
            key_len: piece.len() as u32,
            ids_start: self.ids.len() as u32,
            ids_len: ids.len() as u32,
        };
        self.keys.extend_from_slice(piece);
        self.ids.extend_from_slice(ids);
        self.len += 1;
    }

    /// The number of cached pieces.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every piece (keeping the memory).
    fn clear(&mut self) {
        self.slots.fill(Slot::default());
        self.keys.clear();
        self.ids.clear();
        self.len = 0;
    }
}

thread_local! {
    static CACHE: RefCell<PieceCache> = RefCell::new(PieceCache::default());
}

/// Runs `work` with this thread's cache for encoder `owner`, emptied first if it held another
/// encoder's pieces.
pub fn with_thread_cache<R>(owner: u64, work: impl FnOnce(&mut PieceCache) -> R) -> R {
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.owner != owner {
            cache.clear();
            cache.owner = owner;
        }
        work(&mut cache)
    })
}

/// The hash [`PieceCache`] files `piece` under: FNV-1a, then SplitMix64's final mix so that the
/// low bits the table uses depend on every byte. The keys come from the documents being
/// tokenized, not from an adversary, whose collisions would at worst slow a thread down.
pub fn piece_hash(piece: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut index = 0;
    while index < piece.len() {
        hash = (hash ^ piece[index] as u64).wrapping_mul(0x0000_0100_0000_01b3);
        index += 1;
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}
