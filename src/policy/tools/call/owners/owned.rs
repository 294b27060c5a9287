//! The proof of the ownership check, apart from the check itself so that a call can keep it
//! without its module knowing the check: an [`Owned`] is made only by its parent module
//! (`owners`), once the machine it names passed for the call's user.

use std::sync::Mutex;

/// A machine this call's user may act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned(String);

impl Owned {
    /// Only the ownership check (the parent module) makes one.
    pub(super) fn passed(name: &str) -> Owned {
        Owned(name.to_owned())
    }
}

impl std::ops::Deref for Owned {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The machines the ownership check passed for one call, for its handler to ask for.
#[derive(Debug, Default)]
pub struct KeptOwned(Mutex<Vec<Owned>>);

impl KeptOwned {
    pub fn keep(&self, owned: Owned) {
        if let Ok(mut kept) = self.0.lock() {
            kept.push(owned);
        }
    }

    /// The machine of that name the check passed, if it did.
    pub fn named(&self, name: &str) -> Option<Owned> {
        let kept = self.0.lock().ok()?;
        kept.iter().find(|owned| owned.0 == name).cloned()
    }
}
