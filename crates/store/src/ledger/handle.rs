//! The [`Ledger`] handle every call goes through, and how a call fails.

use crate::keys::RedisKeys;

/// Typed calls to the ledger's scripts and keys in one namespace; cheap to clone.
///
/// Every call takes the connection to run on, so a caller can wait for copies of a write
/// (`WAIT`) on the connection that made it.
#[derive(Debug, Clone)]
pub struct Ledger {
    keys: RedisKeys,
}

impl Ledger {
    /// The ledger of the namespace `keys` builds.
    pub fn new(keys: RedisKeys) -> Self {
        Self { keys }
    }

    /// The key layout it writes.
    pub fn keys(&self) -> &RedisKeys {
        &self.keys
    }
}

/// A ledger call that failed.
#[derive(Debug)]
pub enum LedgerError {
    /// Redis failed, or its answer was lost (the script may have run).
    Redis(redis::RedisError),
    /// A script answered a code its caller does not know.
    UnknownCode {
        /// The script.
        script: &'static str,
        /// What it returned.
        code: i64,
    },
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redis(e) => e.fmt(f),
            Self::UnknownCode { script, code } => write!(f, "{script} script returned {code}"),
        }
    }
}

impl std::error::Error for LedgerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis(e) => Some(e),
            Self::UnknownCode { .. } => None,
        }
    }
}

impl From<redis::RedisError> for LedgerError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}
