//! A process-wide table of shared immutable values: each distinct value is kept once while any holder has it,
//! and every holder has an `Arc` of it. [`crate::atom::Atom`] (names) and [`crate::inventory::Inventory`]
//! (the lists of applied objects that a thousand Clusters on one stack have alike) are kept in one each.
//!
//! The table lets go of a value once no holder has it: it is swept when it has doubled since its last sweep, so
//! its size follows the values in use and a sweep's cost is spread over the values added since.

use std::{
    borrow::Borrow,
    collections::HashSet,
    hash::Hash,
    sync::{Arc, Mutex},
};

/// The values in use, and the table's size after its last sweep.
#[derive(Debug)]
pub(crate) struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

#[derive(Debug)]
struct Table<T: ?Sized> {
    kept: HashSet<Arc<T>>,
    swept_at: usize,
}

/// Tables below this many entries are never swept: a sweep would find little.
pub(crate) const SWEEP_FLOOR: usize = 256;

impl<T: ?Sized + Eq + Hash> Interner<T> {
    pub(crate) fn new() -> Self {
        Interner {
            table: Mutex::new(Table {
                kept: HashSet::new(),
                swept_at: 0,
            }),
        }
    }

    /// The one shared copy of `value`, made by `make` if no one holds it.
    pub(crate) fn get<Q>(&self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Eq + Hash,
    {
        // A poisoned table is still a valid set of values: a panic cannot leave it half-changed.
        let mut table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(kept) = table.kept.get(value) {
            return Arc::clone(kept);
        }
        if table.kept.len() >= SWEEP_FLOOR.max(2 * table.swept_at) {
            // Only the table holds a value whose count is 1, and it is locked: no one can clone it meanwhile.
            table.kept.retain(|kept| Arc::strong_count(kept) > 1);
            table.swept_at = table.kept.len();
        }
        let shared = make(value);
        table.kept.insert(Arc::clone(&shared));
        shared
    }

    /// Whether the table keeps `value` now (for tests).
    #[cfg(test)]
    pub(crate) fn keeps<Q>(&self, value: &Q) -> bool
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Eq + Hash,
    {
        let table = self.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        table.kept.contains(value)
    }
}
