//! Who a call is made for. Over stdio, and over HTTP with the static token, that is the one
//! operator the server belongs to; with OAuth sign-in, the user an access token names (its
//! subject, or the tenant claim the operator chose). Records carry the user's id, and a user
//! sees only the records and machines that carry theirs.

use std::fmt;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct User(Arc<str>);

impl User {
    /// The operator: the one user of a server without sign-in. Its id is empty, which is what
    /// every record made before sign-in existed carries, so upgrading keeps them the operator's.
    pub fn operator() -> User {
        User(Arc::from(""))
    }

    /// A signed-in user, by the claim that names them (never empty: the token check refuses
    /// a token without one).
    pub fn signed_in(id: &str) -> User {
        User(Arc::from(id))
    }

    /// The id records carry.
    pub fn id(&self) -> &str {
        &self.0
    }

    pub fn is_operator(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_operator() {
            f.write_str("(the operator)")
        } else {
            f.write_str(&self.0)
        }
    }
}
