//! What a peer's answer to one of our EVENTs means for the uploader
//! (`upload.rs`): accepted, already there, a rate refusal (sent again
//! later, and the pace cut), or a final refusal counted by its NIP-01
//! prefix. The prefixes are proto's `Reason` (the one vocabulary), read,
//! never written.

use sluice_proto::Reason;

/// The final refusals a peer may send, by prefix (`duplicate` and
/// `rate-limited` are not final refusals).
const FINAL: [Reason; 8] = [
    Reason::Blocked,
    Reason::Invalid,
    Reason::Pow,
    Reason::Restricted,
    Reason::AuthRequired,
    Reason::Unsupported,
    Reason::Error,
    Reason::Closed,
];

/// The label of a final refusal whose prefix is none of NIP-01's.
pub const OTHER: &str = "other";

/// One OK, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// OK true.
    Accepted,
    /// The peer has it (a `duplicate` answer, true or false).
    AlreadyThere,
    /// `rate-limited`: sent again later.
    RateLimited,
    /// Any other refusal: final. `reason` is its prefix as sent (or
    /// [`OTHER`]); `pow`, the difficulty a `pow` refusal asks for.
    Refused {
        reason: &'static str,
        pow: Option<u64>,
    },
}

/// Classifies the OK `["OK", id, ok, message]`.
pub fn classify(ok: bool, message: &str) -> Answer {
    let prefix = message.split_once(':').map(|(p, _)| p.trim());
    if prefix == Some(Reason::Duplicate.as_str()) {
        return Answer::AlreadyThere;
    }
    if ok {
        return Answer::Accepted;
    }
    if prefix == Some(Reason::RateLimited.as_str()) {
        return Answer::RateLimited;
    }
    match FINAL.iter().find(|r| Some(r.as_str()) == prefix) {
        Some(&r) => Answer::Refused {
            reason: r.as_str(),
            pow: (r == Reason::Pow).then(|| difficulty(message)).flatten(),
        },
        None => Answer::Refused {
            reason: OTHER,
            pow: None,
        },
    }
}

/// The difficulty a `pow` refusal names: the number after "difficulty",
/// else its first number.
fn difficulty(message: &str) -> Option<u64> {
    let lower = message.to_ascii_lowercase();
    let from = lower.find("difficulty").unwrap_or(0);
    lower[from..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
}

/// Whether a NOTICE reads as being about our rate: it starts with the
/// `rate-limited` prefix or speaks of a rate limit or of going too fast.
pub fn is_rate_notice(text: &str) -> bool {
    let t = text.trim_start().to_ascii_lowercase();
    t.starts_with(Reason::RateLimited.as_str())
        || [
            "rate limit",
            "rate-limit",
            "ratelimit",
            "too fast",
            "slow down",
            "too many",
        ]
        .iter()
        .any(|w| t.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_is_classified_by_its_prefix() {
        assert_eq!(classify(true, ""), Answer::Accepted);
        assert_eq!(classify(true, "stored"), Answer::Accepted);
        assert_eq!(
            classify(true, "duplicate: already have this event"),
            Answer::AlreadyThere
        );
        assert_eq!(classify(false, "duplicate: newer"), Answer::AlreadyThere);
        assert_eq!(
            classify(false, "rate-limited: slow down, retry in 1.2 s"),
            Answer::RateLimited
        );
        for (msg, reason) in [
            ("blocked: pubkey denied", "blocked"),
            ("invalid: bad signature", "invalid"),
            ("restricted: members only", "restricted"),
            ("auth-required: sign in", "auth-required"),
            ("error: disk full", "error"),
            ("nope", OTHER),
            ("mute: shh", OTHER),
            ("", OTHER),
        ] {
            assert_eq!(
                classify(false, msg),
                Answer::Refused { reason, pow: None },
                "{msg}"
            );
        }
        assert_eq!(
            classify(false, "pow: difficulty 28 required"),
            Answer::Refused {
                reason: "pow",
                pow: Some(28)
            }
        );
        assert_eq!(
            classify(false, "pow: needs 20 bits"),
            Answer::Refused {
                reason: "pow",
                pow: Some(20)
            }
        );
    }

    #[test]
    fn rate_notices_are_told_from_others() {
        for n in [
            "rate-limited: slow down",
            "You are being rate limited",
            "Slow down!",
            "too many events",
        ] {
            assert!(is_rate_notice(n), "{n}");
        }
        for n in ["could not parse", "auth-required: x", "bad msg: rate"] {
            assert!(!is_rate_notice(n), "{n}");
        }
    }
}
