//! libCanal's hybrid address space (vcanal.md §2.6): a cache of GVA → GPA
//! page translations kept as a radix tree shaped like x86-64 four-level
//! paging (9 index bits a level, 4 KiB pages, 48-bit user addresses). A
//! lookup walks it; a miss costs the caller a helper-driver page walk
//! through the guest kernel, whose result is then inserted.
//!
//! Nodes come from an arena preallocated at creation (`max_nodes` of 512
//! entries each), so an insert never allocates; when the arena is used up
//! the whole cache is flushed and refilled (§7: granularity, pinning and
//! invalidation are unstated; pages are pinned so entries never go stale on
//! their own, and [`GvaCache::invalidate`] serves `munmap`).

/// Page size of the cache.
pub const PAGE_SIZE: u64 = 4096;
const PAGE_SHIFT: u32 = 12;
const BITS: u32 = 9;
const FANOUT: usize = 1 << BITS;
const LEVELS: u32 = 4;
/// First GVA past what the cache covers (user half of 48-bit addresses).
pub const GVA_LIMIT: u64 = 1 << (PAGE_SHIFT + BITS * LEVELS);
/// Entry bit: present.
const PRESENT: u64 = 1;

/// The outcome of a lookup, so the caller can charge its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Cached: the GPA.
    Hit(u64),
    /// Not cached: the caller walks the guest page tables.
    Miss,
}

/// Radix-tree GVA → GPA cache.
#[derive(Clone, Debug)]
pub struct GvaCache {
    /// Node arena; node 0 is the root. Interior entries hold
    /// `child << 1 | PRESENT`, leaf entries `gpa_page | PRESENT`.
    nodes: Vec<[u64; FANOUT]>,
    /// Nodes in use.
    used: usize,
    /// Hits and misses so far.
    pub hits: u64,
    /// Misses so far.
    pub misses: u64,
    /// Whole-cache flushes forced by a full arena.
    pub flushes: u64,
}

/// The index `gva` takes at `level` (3 = root).
fn index(gva: u64, level: u32) -> usize {
    ((gva >> (PAGE_SHIFT + BITS * level)) as usize) & (FANOUT - 1)
}

impl GvaCache {
    /// A cache of at most `max_nodes` nodes (at least the root and one
    /// path: 4).
    pub fn new(max_nodes: usize) -> Self {
        Self {
            nodes: vec![[0; FANOUT]; max_nodes.max(LEVELS as usize)],
            used: 1,
            hits: 0,
            misses: 0,
            flushes: 0,
        }
    }

    /// Looks `gva` up, counting a hit or miss. GVAs at or past
    /// [`GVA_LIMIT`] always miss.
    pub fn lookup(&mut self, gva: u64) -> Lookup {
        match self.find(gva) {
            Some(gpa_page) => {
                self.hits += 1;
                Lookup::Hit(gpa_page | (gva & (PAGE_SIZE - 1)))
            }
            None => {
                self.misses += 1;
                Lookup::Miss
            }
        }
    }

    /// The leaf entry for `gva`, if present: (leaf node, index).
    fn leaf(&self, gva: u64) -> Option<(usize, usize)> {
        if gva >= GVA_LIMIT {
            return None;
        }
        let mut node = 0;
        for level in (1..LEVELS).rev() {
            let e = self.nodes[node][index(gva, level)];
            if e & PRESENT == 0 {
                return None;
            }
            node = (e >> 1) as usize;
        }
        Some((node, index(gva, 0)))
    }

    /// The GPA of `gva`'s page, if cached.
    fn find(&self, gva: u64) -> Option<u64> {
        let (n, i) = self.leaf(gva)?;
        let e = self.nodes[n][i];
        (e & PRESENT != 0).then_some(e & !(PAGE_SIZE - 1))
    }

    /// Caches `gva`'s page → `gpa`'s page. Returns false (and caches
    /// nothing) for a GVA past [`GVA_LIMIT`].
    pub fn insert(&mut self, gva: u64, gpa: u64) -> bool {
        if gva >= GVA_LIMIT {
            return false;
        }
        if !self.try_insert(gva, gpa) {
            self.flush();
            self.flushes += 1;
            // An empty tree always has room for one path.
            return self.try_insert(gva, gpa);
        }
        true
    }

    /// Inserts if the arena has the nodes the path needs.
    fn try_insert(&mut self, gva: u64, gpa: u64) -> bool {
        let mut node = 0;
        for level in (1..LEVELS).rev() {
            let i = index(gva, level);
            let e = self.nodes[node][i];
            node = if e & PRESENT != 0 {
                (e >> 1) as usize
            } else {
                if self.used == self.nodes.len() {
                    return false;
                }
                let child = self.used;
                self.used += 1;
                self.nodes[child] = [0; FANOUT];
                self.nodes[node][i] = (child as u64) << 1 | PRESENT;
                child
            };
        }
        self.nodes[node][index(gva, 0)] = (gpa & !(PAGE_SIZE - 1)) | PRESENT;
        true
    }

    /// Drops the translation of `gva`'s page (munmap). Returns whether one
    /// was cached.
    pub fn invalidate(&mut self, gva: u64) -> bool {
        match self.leaf(gva) {
            Some((n, i)) if self.nodes[n][i] & PRESENT != 0 => {
                self.nodes[n][i] = 0;
                true
            }
            _ => false,
        }
    }

    /// Drops every translation.
    pub fn flush(&mut self) {
        self.nodes[0] = [0; FANOUT];
        self.used = 1;
    }

    /// Nodes in use (root included).
    pub fn nodes_used(&self) -> usize {
        self.used
    }

    /// Nodes the arena holds.
    pub fn capacity(&self) -> usize {
        self.nodes.len()
    }
}

/// A buffer translated for an INR: its GPA and the GPA-contiguous prefix
/// of it, with the cache outcomes the caller charges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// GPA of the first byte.
    pub gpa: u64,
    /// Bytes from `gpa` that are contiguous in guest-physical memory (the
    /// whole buffer, or a prefix: the call becomes a short transfer).
    pub len: u64,
    /// Pages found in the cache.
    pub hits: u32,
    /// Pages the helper driver walked.
    pub misses: u32,
}

/// Translates the buffer `[gva, gva + len)` page by page through `cache`,
/// calling `walk(gva_page) -> Some(gpa_page)` on a miss (the helper
/// driver's page-table walk) and caching its answer. Stops at the first
/// page whose GPA does not follow the previous one. `None` if the first
/// page is unmapped, the range overflows, or it reaches past
/// [`GVA_LIMIT`].
pub fn translate(
    cache: &mut GvaCache,
    gva: u64,
    len: u64,
    mut walk: impl FnMut(u64) -> Option<u64>,
) -> Option<Translation> {
    let mut t = Translation::default();
    if len == 0 {
        return Some(t);
    }
    let end = gva.checked_add(len).filter(|&e| e <= GVA_LIMIT)?;
    let mut page = gva & !(PAGE_SIZE - 1);
    while page < end {
        let gpa_page = match cache.lookup(page) {
            Lookup::Hit(g) => {
                t.hits += 1;
                g
            }
            Lookup::Miss => {
                t.misses += 1;
                let g = walk(page).map(|g| g & !(PAGE_SIZE - 1));
                if let Some(g) = g {
                    cache.insert(page, g);
                }
                match g {
                    Some(g) => g,
                    None if page == gva & !(PAGE_SIZE - 1) => return None,
                    None => break,
                }
            }
        };
        let start = gva.max(page);
        if page == gva & !(PAGE_SIZE - 1) {
            t.gpa = gpa_page | (gva & (PAGE_SIZE - 1));
        } else if gpa_page != t.gpa + t.len {
            break;
        }
        t.len += (page + PAGE_SIZE).min(end) - start;
        page += PAGE_SIZE;
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miss_then_hit_with_the_page_offset() {
        let mut c = GvaCache::new(16);
        assert_eq!(c.lookup(0x7fff_1234_5678), Lookup::Miss);
        assert!(c.insert(0x7fff_1234_5000, 0x8_0000_0000));
        assert_eq!(c.lookup(0x7fff_1234_5678), Lookup::Hit(0x8_0000_0678));
        assert_eq!(c.lookup(0x7fff_1234_5fff), Lookup::Hit(0x8_0000_0fff));
        // Neighbouring page, same leaf node: a miss.
        assert_eq!(c.lookup(0x7fff_1234_6000), Lookup::Miss);
        assert_eq!((c.hits, c.misses), (2, 2));
        // Root + 3 levels below it for one path.
        assert_eq!(c.nodes_used(), 4);
        // A far address shares only the root.
        assert!(c.insert(0x1000, 0x2000));
        assert_eq!(c.nodes_used(), 7);
        assert_eq!(c.lookup(0x1001), Lookup::Hit(0x2001));
    }

    #[test]
    fn invalidation_and_flush_drop_entries() {
        let mut c = GvaCache::new(16);
        c.insert(0x40_0000, 0x10_0000);
        c.insert(0x40_1000, 0x10_1000);
        assert!(c.invalidate(0x40_0abc));
        assert!(!c.invalidate(0x40_0abc));
        assert_eq!(c.lookup(0x40_0000), Lookup::Miss);
        assert_eq!(c.lookup(0x40_1000), Lookup::Hit(0x10_1000));
        c.flush();
        assert_eq!(c.lookup(0x40_1000), Lookup::Miss);
        assert_eq!(c.nodes_used(), 1);
    }

    #[test]
    fn a_full_arena_flushes_and_never_grows() {
        // Root + one path = 4 nodes; a second distant path needs 3 more.
        let mut c = GvaCache::new(5);
        assert!(c.insert(0x1000, 0xa000));
        assert!(c.insert(0x7f00_0000_0000, 0xb000));
        assert_eq!(c.flushes, 1);
        assert_eq!(c.capacity(), 5);
        assert_eq!(c.lookup(0x1000), Lookup::Miss);
        assert_eq!(c.lookup(0x7f00_0000_0000), Lookup::Hit(0xb000));
    }

    #[test]
    fn addresses_past_the_limit_are_never_cached() {
        let mut c = GvaCache::new(8);
        assert!(!c.insert(GVA_LIMIT, 0x1000));
        assert_eq!(c.lookup(GVA_LIMIT + 5), Lookup::Miss);
        assert_eq!(c.lookup(u64::MAX), Lookup::Miss);
    }

    #[test]
    fn buffers_translate_per_page_and_stop_at_a_gpa_gap() {
        let mut c = GvaCache::new(16);
        let mut walks = Vec::new();
        // GVA page p maps to GPA 0x100000 + p, except page 0x13000 which
        // maps elsewhere.
        let mut walk = |p: u64| {
            walks.push(p);
            Some(if p == 0x13000 { 0x900000 } else { 0x100000 + p })
        };
        // 0x10800 .. 0x12800: three pages, contiguous.
        let t = translate(&mut c, 0x10800, 0x2000, &mut walk).unwrap();
        assert_eq!(
            t,
            Translation {
                gpa: 0x110800,
                len: 0x2000,
                hits: 0,
                misses: 3
            }
        );
        // Again: all hits, no walks.
        let t = translate(&mut c, 0x10800, 0x2000, &mut walk).unwrap();
        assert_eq!((t.hits, t.misses, t.len), (3, 0, 0x2000));
        // Across the gap at 0x13000: the prefix up to it.
        let t = translate(&mut c, 0x12f00, 0x1000, &mut walk).unwrap();
        assert_eq!((t.gpa, t.len), (0x112f00, 0x100));
        assert_eq!(walks, vec![0x10000, 0x11000, 0x12000, 0x13000]);
        // An unmapped first page: no translation; overflow: none either.
        assert_eq!(translate(&mut c, 0x50000, 8, |_| None), None);
        assert_eq!(translate(&mut c, u64::MAX - 4, 8, Some), None);
        assert_eq!(
            translate(&mut c, 0x50000, 0, |_| None),
            Some(Translation::default())
        );
    }
}
