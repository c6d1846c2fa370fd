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

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine-readable prefixes clients act on (NIP-01 OK and CLOSED,
    /// NIP-42 `auth-required`, NIP-77 `closed`), also the `reason` label of
    /// the refusal metrics.
    #[test]
    fn each_reason_is_its_wire_prefix() {
        for (reason, prefix) in [
            (Reason::Duplicate, "duplicate"),
            (Reason::Pow, "pow"),
            (Reason::Blocked, "blocked"),
            (Reason::RateLimited, "rate-limited"),
            (Reason::Invalid, "invalid"),
            (Reason::Restricted, "restricted"),
            (Reason::AuthRequired, "auth-required"),
            (Reason::Unsupported, "unsupported"),
            (Reason::Error, "error"),
            (Reason::Closed, "closed"),
        ] {
            assert_eq!(reason.as_str(), prefix, "{reason:?}");
        }
    }

    #[test]
    fn a_message_is_the_prefix_a_colon_a_space_and_the_detail() {
        assert_eq!(
            Reason::RateLimited.message("slow down"),
            "rate-limited: slow down"
        );
        assert_eq!(
            Reason::AuthRequired.message("we only serve DMs to their parties"),
            "auth-required: we only serve DMs to their parties"
        );
        assert_eq!(Reason::Invalid.message(""), "invalid: ");
    }
}
