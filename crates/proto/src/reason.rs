//! The machine-readable prefixes of NIP-01 OK and CLOSED messages (and of
//! NIP-77's NEG-ERR). Every refusal the relay sends is built from one of
//! these, so clients can act on the prefix and metrics can count by it.

/// A NIP-01 reason prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    Duplicate,
    Pow,
    Blocked,
    RateLimited,
    Invalid,
    Restricted,
    AuthRequired,
    Unsupported,
    Error,
    /// NIP-77: a NEG-ERR for a negentropy session the relay does not hold.
    Closed,
}

impl Reason {
    /// The prefix as it appears on the wire, without the colon.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Duplicate => "duplicate",
            Reason::Pow => "pow",
            Reason::Blocked => "blocked",
            Reason::RateLimited => "rate-limited",
            Reason::Invalid => "invalid",
            Reason::Restricted => "restricted",
            Reason::AuthRequired => "auth-required",
            Reason::Unsupported => "unsupported",
            Reason::Error => "error",
            Reason::Closed => "closed",
        }
    }

    /// `"<prefix>: <detail>"`, the form NIP-01 asks for.
    pub fn message(self, detail: &str) -> String {
        format!("{}: {}", self.as_str(), detail)
    }
}
